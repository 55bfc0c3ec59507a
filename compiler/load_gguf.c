/*
 * load_gguf.c - gguf weights (being written; reports "not supported yet").
 */
#include "compiler/weights_impl.h"

bool load_gguf(Weights *w, const char *path, Diag *d)
{
    diag_file_error(d, path ? path : "megac", "gguf weights are not supported yet");
    return false;
}
