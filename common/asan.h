/* asan.h: marking memory the program still owns but must not read (a pooled buffer between two
 * users) under AddressSanitizer; no-ops in other builds. */
#pragma once
#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__)
#define DF_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DF_ASAN 1
#endif
#endif

#ifdef DF_ASAN
#include <sanitizer/asan_interface.h>
static inline void df_poison(const void *p, size_t n) { ASAN_POISON_MEMORY_REGION(p, n); }
static inline void df_unpoison(const void *p, size_t n) { ASAN_UNPOISON_MEMORY_REGION(p, n); }
static inline int df_poisoned(const void *p) { return __asan_address_is_poisoned(p); }
#else
static inline void df_poison(const void *p, size_t n) { (void)p, (void)n; }
static inline void df_unpoison(const void *p, size_t n) { (void)p, (void)n; }
static inline int df_poisoned(const void *p) { (void)p; return 0; }
#endif
