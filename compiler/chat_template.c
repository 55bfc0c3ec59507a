/*
 * chat_template.c - which chat format a model's chat template (Jinja, from
 * a GGUF's tokenizer.chat_template or an HF folder's tokenizer_config.json
 * or chat_template.jinja) writes, and the system turn it writes when a
 * conversation gives none.
 *
 * The template is not executed: it is recognized by the markers it writes,
 * as llama.cpp recognizes templates (ChatML's <|im_start|>, Llama 3's
 * <|start_header_id|>, Zephyr's <|user|> and <|assistant|>, Llama 2's
 * [INST] with <<SYS>>; Mistral's [INST] without it, whose versions write
 * turns differently, is not recognized), and `megac run --chat` then
 * writes turns in that format (compiler/cmd_run.c). A ChatML template's
 * default system turn is the
 * one string literal of the template (inside its {{ }} and {% %} tags)
 * that is a whole system turn: '<|im_start|>system\n' TEXT '<|im_end|>\n',
 * TEXT without a tag (SmolLM2's "You are a helpful AI assistant named
 * SmolLM...", Qwen2.5's "You are Qwen, created by Alibaba Cloud..."). Two
 * such literals with different TEXT leave none: which one the template
 * picks would take running it.
 */
#include "compiler/compile.h"

#include <stdlib.h>
#include <string.h>

static bool has(const char *s, size_t n, const char *what)
{
    return memmem(s, n, what, strlen(what)) != NULL;
}

/* The string literal that starts at s[*at] (a quote), unescaped as Jinja
 * reads it (\n, \t, \r, \\, \', \", and \ before anything else kept);
 * *at moves past it. NULL when it does not end. */
static char *literal_read(const char *s, size_t n, size_t *at)
{
    char q = s[*at];
    char *out = xmalloc(n - *at + 1);
    size_t k = 0;
    for (size_t i = *at + 1; i < n; i++) {
        if (s[i] == q) {
            out[k] = 0;
            *at = i + 1;
            return out;
        }
        if (s[i] == '\\' && i + 1 < n) {
            char e = s[++i];
            out[k++] = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
            if (e != 'n' && e != 't' && e != 'r' && e != '\\' && e != '\'' && e != '"')
                out[k - 1] = '\\', out[k++] = e;
            continue;
        }
        out[k++] = s[i];
    }
    free(out);
    *at = n;
    return NULL;
}

/* A literal that is a whole ChatML system turn gives its text. */
static char *chatml_system_of(const char *lit)
{
    static const char head[] = "<|im_start|>system\n", tail[] = "<|im_end|>\n";
    size_t n = strlen(lit), h = sizeof head - 1, t = sizeof tail - 1;
    if (n < h + t || strncmp(lit, head, h) != 0 || strcmp(lit + n - t, tail) != 0)
        return NULL;
    char *text = xstrndup(lit + h, n - h - t);
    if (strstr(text, "<|") || !*text) {
        free(text);
        return NULL;
    }
    return text;
}

/* The one whole system turn among the literals inside the template's tags;
 * NULL for none, or for two that differ. */
static char *chatml_default_system(const char *s, size_t n)
{
    char *found = NULL;
    bool ambiguous = false;
    for (size_t i = 0; i + 1 < n;) {
        if (s[i] != '{' || (s[i + 1] != '{' && s[i + 1] != '%')) {
            i++;
            continue;
        }
        char close = s[i + 1] == '{' ? '}' : '%';
        for (i += 2; i + 1 < n && !(s[i] == close && s[i + 1] == '}');) {
            if (s[i] != '\'' && s[i] != '"') {
                i++;
                continue;
            }
            char *lit = literal_read(s, n, &i), *sys = lit ? chatml_system_of(lit) : NULL;
            free(lit);
            if (sys && found && strcmp(sys, found) != 0)
                ambiguous = true;
            if (sys && !found)
                found = sys;
            else
                free(sys);
        }
        i += 2;
    }
    if (ambiguous) {
        free(found);
        return NULL;
    }
    return found;
}

ChatKind chat_template_kind(const char *tmpl, size_t len, char **default_system)
{
    *default_system = NULL;
    if (!tmpl || !len)
        return CHAT_UNKNOWN;
    if (has(tmpl, len, "<|im_start|>")) {
        char *sys = chatml_default_system(tmpl, len);
        if (sys && strlen(sys) <= TOK_MAX_SYSTEM && tok_utf8_valid(sys, strlen(sys)))
            *default_system = sys;
        else
            free(sys);
        return CHAT_CHATML;
    }
    if (has(tmpl, len, "<|start_header_id|>"))
        return CHAT_LLAMA3;
    if (has(tmpl, len, "<|user|>") && has(tmpl, len, "<|assistant|>") && !has(tmpl, len, "<|end|>"))
        return CHAT_ZEPHYR;
    if (has(tmpl, len, "[INST]") && has(tmpl, len, "<<SYS>>"))
        return CHAT_LLAMA2;
    return CHAT_UNKNOWN;
}

const char *chat_kind_name(ChatKind k)
{
    static const char *const names[] = {"unknown", "ChatML", "Llama 3", "Zephyr", "Llama 2"};
    return (unsigned)k < sizeof names / sizeof *names ? names[k] : "unknown";
}
