/*
 * validator.c - placeholder until the validator lands.
 */
#include "validator/validator.h"
