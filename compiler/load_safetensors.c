/*
 * load_safetensors.c - safetensors weights (being written; reports "not supported yet").
 */
#include "compiler/weights_impl.h"

bool load_safetensors(Weights *w, const char *path, Diag *d)
{
    diag_file_error(d, path ? path : "megac", "safetensors weights are not supported yet");
    return false;
}
