/*
 * chat_template.c - which chat format a model's chat template (Jinja, from
 * a GGUF's tokenizer.chat_template or an HF folder's tokenizer_config.json
 * or chat_template.jinja) writes, and the system turn it writes when a
 * conversation gives none.
 *
 * The template is not executed: it is recognized by the markers it writes,
 * as llama.cpp recognizes templates (ChatML's <|im_start|>, Llama 3's
 * <|start_header_id|>, Zephyr's <|user|> and <|assistant|> (Phi-3's with
 * <|end|> too), Llama 2's
 * [INST] with <<SYS>>; Mistral's [INST] without it, whose versions write
 * turns differently, is not recognized), and `megac run --chat` then
 * writes turns in that format (compiler/cmd_run.c). A Llama 3 template
 * that writes a literal line "Cutting Knowledge Date: ...\n" and "Today
 * Date: " (Llama 3.1-3.3) always writes a system turn with that preamble
 * (runtime/tokenizer.h: the date its date_string is set to, or the day it
 * runs where it calls strftime_now). A ChatML template's
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

/* Calls each(literal, ctx) for the string literals inside the template's
 * {{ }} and {% %} tags, in order, unescaped (each frees its literal); stops
 * where each returns false. */
static void tag_literals(const char *s, size_t n, bool (*each)(char *lit, void *ctx), void *ctx)
{
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
            char *lit = literal_read(s, n, &i);
            if (lit && !each(lit, ctx))
                return;
        }
        i += 2;
    }
}

typedef struct {
    char *found;
    bool ambiguous;
} SystemSearch;

static bool system_literal(char *lit, void *ctx)
{
    SystemSearch *ss = ctx;
    char *sys = chatml_system_of(lit);
    free(lit);
    if (sys && ss->found && strcmp(sys, ss->found) != 0)
        ss->ambiguous = true;
    if (sys && !ss->found)
        ss->found = sys;
    else
        free(sys);
    return true;
}

/* The one whole system turn among the literals inside the template's tags;
 * NULL for none, or for two that differ. */
static char *chatml_default_system(const char *s, size_t n)
{
    SystemSearch ss = {0};
    tag_literals(s, n, system_literal, &ss);
    if (ss.ambiguous) {
        free(ss.found);
        return NULL;
    }
    return ss.found;
}

/* Llama 3.1's knowledge cutoff: a literal line of text that starts with
 * "Cutting Knowledge Date:". */
static bool cutoff_literal(char *lit, void *ctx)
{
    char **found = ctx;
    size_t n = strlen(lit);
    if (!strncmp(lit, "Cutting Knowledge Date:", 23) && n > 23 && lit[n - 1] == '\n' && !memchr(lit, '\n', n - 1) &&
        !strstr(lit, "<|")) {
        *found = lit;
        return false;
    }
    free(lit);
    return true;
}

/* The literal a template sets date_string to (`set date_string = "26 Jul
 * 2024"`), a short line; NULL for none. */
static char *date_string_literal(const char *s, size_t n)
{
    static const char key[] = "date_string";
    for (const char *p = s; (p = memmem(p, n - (size_t)(p - s), key, sizeof key - 1)) != NULL;) {
        size_t i = (size_t)(p - s) + sizeof key - 1;
        p += sizeof key - 1;
        while (i < n && s[i] == ' ')
            i++;
        if (i + 1 >= n || s[i] != '=' || s[i + 1] == '=')
            continue;
        for (i++; i < n && s[i] == ' ';)
            i++;
        if (i >= n || (s[i] != '\'' && s[i] != '"'))
            continue;
        char *lit = literal_read(s, n, &i);
        if (lit && *lit && strlen(lit) <= 64 && !strchr(lit, '\n') && !strstr(lit, "<|"))
            return lit;
        free(lit);
    }
    return NULL;
}

/* A Llama 3 template that always writes a system turn starting with a
 * knowledge cutoff and "Today Date: " (Llama 3.1, 3.2, 3.3): the preamble,
 * with the date it sets, or without its date line where it takes today's
 * (strftime_now). Plain CHAT_LLAMA3 where it has no such turn. */
static ChatKind llama31_preamble(const char *s, size_t n, char **text)
{
    char *cutoff = NULL;
    tag_literals(s, n, cutoff_literal, &cutoff);
    if (!cutoff || !has(s, n, "Today Date: ")) {
        free(cutoff);
        return CHAT_LLAMA3;
    }
    if (has(s, n, "strftime_now")) {
        *text = cutoff;
        return CHAT_LLAMA31_TODAY;
    }
    char *date = date_string_literal(s, n);
    if (date)
        *text = xasprintf("%sToday Date: %s\n\n", cutoff, date);
    free(cutoff);
    free(date);
    return *text ? CHAT_LLAMA31 : CHAT_LLAMA3;
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
    if (has(tmpl, len, "<|start_header_id|>")) {
        ChatKind k = llama31_preamble(tmpl, len, default_system);
        if (*default_system && !tok_utf8_valid(*default_system, strlen(*default_system))) {
            free(*default_system);
            *default_system = NULL;
            k = CHAT_LLAMA3;
        }
        return k;
    }
    if (has(tmpl, len, "<|user|>") && has(tmpl, len, "<|assistant|>"))
        return has(tmpl, len, "<|end|>") ? CHAT_PHI3 : CHAT_ZEPHYR;
    if (has(tmpl, len, "[INST]") && has(tmpl, len, "<<SYS>>"))
        return CHAT_LLAMA2;
    return CHAT_UNKNOWN;
}

const char *chat_kind_name(ChatKind k)
{
    static const char *const names[] = {"unknown", "ChatML",  "Llama 3", "Zephyr", "Llama 2", "Llama 3.1",
                                        "Llama 3.1 (today's date)", "Phi-3"};
    return (unsigned)k < sizeof names / sizeof *names ? names[k] : "unknown";
}
