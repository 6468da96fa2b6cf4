/*
 * Fuzz harness of the compiled shim's answer parser (npf_parse_answer), built with the shim's source
 * under -DNPF_NO_MAIN and ASan+UBSan. With clang, -DNPF_LIBFUZZER gives libFuzzer's entry point;
 * otherwise main() runs a bounded random fuzz: structured frames (known and unknown tags, lengths
 * that lie, repeated fields) and raw random bytes, from a seed, for a fixed number of cases.
 * Every accepted answer must point inside the body, and the exit status must be one byte.
 */
#define NPF_NO_MAIN
#include "netplugin_cni.c"

static void check(const unsigned char *body, size_t len) {
    struct answer a;
    const char *why = NULL;
    /* A private copy of exactly len bytes: ASan catches any read past it. */
    unsigned char *copy = malloc(len ? len : 1);
    if (!copy)
        abort();
    memcpy(copy, body, len);
    if (npf_parse_answer(copy, len, &a, &why) == 0) {
        const unsigned char *end = copy + len;
        if (a.code < -1 || a.code > 255)
            abort();
        if ((a.out && (a.out < copy || a.out + a.out_len > end)) || (a.err && (a.err < copy || a.err + a.err_len > end)) ||
            (a.why && (a.why < copy || a.why + a.why_len > end)))
            abort();
        if (a.code == -1 && !a.why)
            abort();
    } else if (!why) {
        abort();
    }
    free(copy);
}

#ifdef NPF_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check(data, size);
    return 0;
}
#else
static uint64_t state;
static uint32_t rnd(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (uint32_t)state;
}

int main(int argc, char **argv) {
    unsigned long cases = argc > 1 ? strtoul(argv[1], NULL, 10) : 200000;
    state = argc > 2 ? strtoull(argv[2], NULL, 10) : 0x9e3779b97f4a7c15ULL;
    if (!state)
        state = 1;
    static const unsigned char tags[] = {'X', 'O', 'R', 'U', 'E', 'I', 0, 0xff};
    unsigned char *buf = malloc(1 << 16);
    if (!buf)
        return 2;
    for (unsigned long i = 0; i < cases; i++) {
        size_t len = 0;
        if (rnd() % 4 == 0) { /* raw bytes */
            len = rnd() % 64;
            for (size_t j = 0; j < len; j++)
                buf[j] = (unsigned char)rnd();
        } else { /* fields, some of them lying about their length */
            int fields = (int)(rnd() % 6);
            for (int f = 0; f < fields && len + 5 + 512 < (1 << 16); f++) {
                size_t n = rnd() % 3 == 0 ? 1 : rnd() % 512;
                uint32_t claimed = (uint32_t)n;
                if (rnd() % 8 == 0)
                    claimed = rnd(); /* past the body, or huge */
                buf[len++] = tags[rnd() % sizeof tags];
                buf[len++] = (unsigned char)(claimed >> 24);
                buf[len++] = (unsigned char)(claimed >> 16);
                buf[len++] = (unsigned char)(claimed >> 8);
                buf[len++] = (unsigned char)claimed;
                for (size_t j = 0; j < n; j++)
                    buf[len++] = (unsigned char)rnd();
            }
            if (len && rnd() % 5 == 0)
                len -= rnd() % len; /* truncated */
        }
        check(buf, len);
    }
    free(buf);
    printf("fuzzed %lu answers\n", cases);
    return 0;
}
#endif
