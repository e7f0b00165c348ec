/* kvplan chat formats: chat messages -> the prompt text a chat-tuned model was trained on.
 *
 * A chat model's tokenizer metadata carries its template as Jinja source (GGUF
 * `tokenizer.chat_template`, Hugging Face tokenizer_config.json `chat_template`). kvplan has no
 * Jinja engine; instead it recognises the template families in wide use by the control tokens
 * their source writes (as llama.cpp's llm_chat_detect_template does), and renders them in C:
 *
 *   chatml   "<|im_start|>" ROLE "\n" CONTENT "<|im_end|>\n" ...  "<|im_start|>assistant\n"
 *   llama2   "[INST] " [ "<<SYS>>\n" SYSTEM "\n<</SYS>>\n\n" ] USER " [/INST]" " " ANSWER " </s>"
 *            then "<s>[INST] " USER " [/INST]" for later turns (Llama 2 chat's template)
 *   llama3   "<|start_header_id|>" ROLE "<|end_header_id|>\n\n" CONTENT "<|eot_id|>" ...
 *            "<|start_header_id|>assistant<|end_header_id|>\n\n"
 *   zephyr   "<|" ROLE "|>\n" CONTENT "</s>\n" ...  "<|assistant|>\n"
 *   gemma    "<start_of_turn>" (user|model) "\n" CONTENT "<end_of_turn>\n" ...
 *            "<start_of_turn>model\n" (a system message is put before the first user's content)
 *   phi3     "<|" ROLE "|>\n" CONTENT "<|end|>\n" ...  "<|assistant|>\n" (Phi-3's template; it
 *            has no system turn, so one is written as "<|system|>\n" CONTENT "<|end|>\n" as
 *            later Phi-3 templates do)
 *   plain    the contents joined by "\n", no role markers (models that know no roles)
 *
 * The rendered text leaves out a leading BOS: encoding adds the tokenizer's BOS as it does for
 * any prompt. Contents are stripped of surrounding white space where the family's template
 * strips them (llama2, llama3, gemma). Roles are "system", "user" and "assistant".
 */
#ifndef KVPLAN_CHAT_H
#define KVPLAN_CHAT_H

#include "kvplan/common.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

typedef enum kv_chat_format {
    KV_CHAT_PLAIN = 0,
    KV_CHAT_CHATML = 1,
    KV_CHAT_LLAMA2 = 2,
    KV_CHAT_LLAMA3 = 3,
    KV_CHAT_ZEPHYR = 4,
    KV_CHAT_GEMMA = 5,
    KV_CHAT_PHI3 = 6,
} kv_chat_format;

/* One message: role "system", "user" or "assistant"; content UTF-8 text. Borrowed. */
typedef struct kv_chat_msg {
    const char *role;
    const char *content;
} kv_chat_msg;

/* The family of a Jinja chat template, recognised by the markers its source writes
 * ("<|im_start|>", "[INST]", "<|start_header_id|>", "<start_of_turn>", "<|user|>" with "<|end|>"
 * for phi3 or without for zephyr); NULL or a
 * template of no known family gives KV_CHAT_PLAIN and *known = 0 (known may be NULL). */
kv_chat_format kv_chat_detect(const char *jinja, int *known);

/* The format's name ("plain", "chatml", "llama2", "llama3", "zephyr", "gemma", "phi3"). */
const char *kv_chat_format_name(kv_chat_format f);
/* The format named `name` (as kv_chat_format_name). 0 on success, KV_EINPUT (err names the
 * known names) otherwise. */
int kv_chat_format_parse(const char *name, kv_chat_format *out, kv_error *err);

/* The text that ends an answer's turn in format f ("<|im_end|>", "</s>", "<|eot_id|>",
 * "<end_of_turn>", "<|end|>"), or NULL (plain). A server stops generating there. */
const char *kv_chat_end_of_turn(kv_chat_format f);

/* Render msgs[0..n) in format f, followed by the cue for the assistant's answer (none for
 * plain). *out is a NUL-terminated string the caller owns (free()). KV_EINPUT when n < 1, a
 * role is not system/user/assistant or a content is NULL; KV_EINTERNAL when out of memory. */
int kv_chat_render(kv_chat_format f, const kv_chat_msg *msgs, int n, char **out, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
