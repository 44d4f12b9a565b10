/* test_text.c: text cut between characters, never inside one, and cleaned of what is no UTF-8
 * or a control character (common/text.h). */
#include <string.h>
#include "common/text.h"
#include "tests/test.h"

static void cleans(const char *in, const char *want)
{
    char s[64];
    snprintf(s, sizeof s, "%s", in);
    size_t plain = text_plain_len(in), first = 0;
    while (in[first] && in[first] == want[first])
        first++;
    if (plain != first)
        TEST_FAIL("text_plain_len('%s') = %zu, want %zu", in, plain, first);
    text_clean(s);
    if (strcmp(s, want) || strlen(s) != strlen(in))
        TEST_FAIL("text_clean: got '%s', want '%s'", s, want);
}

int main(void)
{
    /* "é" is 2 bytes, "€" 3, "😀" 4 */
    const char *s = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z";
    CHECK_INT(text_fit(s, 100), ==, 11);
    CHECK_INT(text_fit(s, 11), ==, 11);
    CHECK_INT(text_fit(s, 10), ==, 10);     /* before "z" */
    CHECK_INT(text_fit(s, 9), ==, 6);       /* "😀" would be cut */
    CHECK_INT(text_fit(s, 7), ==, 6);
    CHECK_INT(text_fit(s, 6), ==, 6);
    CHECK_INT(text_fit(s, 5), ==, 3);       /* "€" would be cut */
    CHECK_INT(text_fit(s, 2), ==, 1);       /* "é" would be cut */
    CHECK_INT(text_fit(s, 0), ==, 0);
    CHECK_INT(text_fit("", 0), ==, 0);
    char c[16];
    snprintf(c, sizeof c, "%s", "x\xc3\xa9y");
    text_cut(c, 2);
    CHECK_STR(c, "x");
    snprintf(c, sizeof c, "%s", "x\xc3\xa9y");
    text_cut(c, 9);
    CHECK_STR(c, "x\xc3\xa9y");

    cleans("plain text, \xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "plain text, \xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    cleans("a\nb\tc\x1b[2J\x7f", "a?b?c?[2J?");
    cleans("\xc2\x80 \xc2\x9b \xc2\x9f \xc2\xa0", "?? ?? ?? \xc2\xa0");       /* C1 controls; NBSP is text */
    cleans("\xc0\xaf \xe0\x80\xaf \xf0\x80\x80\xaf", "?? ??? ????");          /* overlong '/' */
    cleans("\xed\xa0\x80 \xed\x9f\xbf", "??? \xed\x9f\xbf");                  /* a surrogate; U+D7FF is text */
    cleans("\xf4\x90\x80\x80 \xf4\x8f\xbf\xbf", "???? \xf4\x8f\xbf\xbf");    /* past U+10FFFF; U+10FFFF */
    cleans("\xf8\x88\x80\x80\x80 \xff \xfe", "????? ? ?");
    cleans("\x80\xbf lone", "?? lone");                                        /* continuation bytes alone */
    cleans("cut \xe2\x82", "cut ??");                                         /* a character cut short */
    cleans("cut \xf0\x9f\x98", "cut ???");
    cleans("\xe2\x82z", "??z");
    puts("ok: text_fit, text_cut, text_clean");
    return 0;
}
