/*
 * runtime.c - placeholder until the runtime lands.
 */
#include "runtime/megac.h"
