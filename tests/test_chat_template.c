/* Chat templates (include/kdt/chat.h): the known families' renderings of plain conversations,
 * written out by hand from their Jinja templates (DeepSeek-V3's tokenizer_config.json, Kimi K2's
 * chat_template.jinja), and the refusals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kdt/chat.h"

/* Fragments of the real templates: detection looks for their special tokens. */
#define DEEPSEEK_TMPL "{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}{{'<｜User｜>' + message['content']}}" \
                      "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{% endfor %}"
#define KIMI_TMPL "{%- for message in messages -%}{%- if message['role'] == 'user' -%}<|im_user|>user<|im_middle|>" \
                  "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"

static void expect(const char *what, const char *tmpl, const kdt_chat_message *m, int n, const char *want) {
    char *got = NULL;
    const kdt_status s = kdt_chat_render(tmpl, m, n, &got);
    if (s == KDT_OK && got && strcmp(got, want) == 0) kt_pass("chat %s", what);
    else kt_fail("chat %s: %s\n      got  %s\n      want %s", what, kdt_status_name(s), got ? got : kdt_last_error(), want);
    free(got);
}

int main(void) {
    const kdt_chat_message conv[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"system", "No emoji."},
                                     {"user", "2+2?"}};
    kt_check(kdt_chat_detect(DEEPSEEK_TMPL) == KDT_CHAT_DEEPSEEK_V3 && kdt_chat_detect(KIMI_TMPL) == KDT_CHAT_KIMI_K2 &&
                 kdt_chat_detect("{{ messages }}") == KDT_CHAT_UNKNOWN && kdt_chat_detect(NULL) == KDT_CHAT_UNKNOWN,
             "chat: families detected from their special tokens");
    expect("DeepSeek-V3, systems gathered first", DEEPSEEK_TMPL, conv, 5,
           "<｜begin▁of▁sentence｜>Be brief.\n\nNo emoji.<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜>");
    expect("DeepSeek-V3, no system", DEEPSEEK_TMPL, conv + 1, 1, "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>");
    expect("Kimi K2, in order", KIMI_TMPL, conv, 3,
           "<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>"
           "<|im_assistant|>assistant<|im_middle|>Hello!<|im_end|><|im_assistant|>assistant<|im_middle|>");
    expect("Kimi K2, its default system before a first user message", KIMI_TMPL, conv + 1, 1,
           "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
           "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>");
    char *t = NULL;
    kdt_status s = kdt_chat_render("{{ messages }}", conv, 5, &t);
    kt_check(s == KDT_ERR_UNSUPPORTED && !t && strstr(kdt_last_error(), "template"), "chat: an unknown template is refused: %s",
             kdt_last_error());
    const kdt_chat_message bad[] = {{"user", "a"}, {"tool", "b"}};
    s = kdt_chat_render(DEEPSEEK_TMPL, bad, 2, &t);
    kt_check(s == KDT_ERR_INVALID_ARG && !t && strstr(kdt_last_error(), "messages[1]"), "chat: a bad role names its message: %s",
             kdt_last_error());
    s = kdt_chat_render(KIMI_TMPL, bad, 0, &t);
    kt_check(s == KDT_ERR_INVALID_ARG && !t, "chat: no messages is refused: %s", kdt_last_error());
    return kt_exit_code();
}
