/* Force-included into every C helper by setup.py (x86-64 glibc only).
 *
 * glibc 2.34 moved the pthread functions into libc under a new symbol version, so a
 * helper built on a newer system would refuse to load on glibc < 2.34 and the wheel
 * would be tagged manylinux_2_34. Binding the calls to their original x86-64
 * version (GLIBC_2.2.5, which every glibc since still provides) keeps the wheel
 * manylinux_2_17: one wheel for every x86-64 glibc Linux that CUDA supports.
 */
#include <pthread.h> /* defines __GLIBC__ and declares the two calls */

#if defined(__linux__) && defined(__x86_64__) && defined(__GLIBC__)
__asm__(".symver pthread_create,pthread_create@GLIBC_2.2.5");
__asm__(".symver pthread_join,pthread_join@GLIBC_2.2.5");
#endif
