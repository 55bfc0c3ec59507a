/*
 * gguf_patch.h - finding a metadata key in a GGUF file's bytes, so that a
 * test can patch a fixture's value into a malformed or refused one.
 */
#ifndef MEGAC_TEST_GGUF_PATCH_H
#define MEGAC_TEST_GGUF_PATCH_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

/* Offset of key `key`'s u32 type in a GGUF's metadata (its value follows):
 * the key's bytes right after their u64 length. */
static inline size_t test_gguf_kv_at(const unsigned char *raw, size_t n, const char *key)
{
    size_t k = strlen(key);
    for (size_t i = 8; i + k + 4 <= n; i++)
        if (memcmp(raw + i, key, k) == 0 && raw[i - 8] == k)
            return i + k;
    cr_assert_fail("key '%s' not found", key);
    return 0;
}

#endif
