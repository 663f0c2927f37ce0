// FUZZ_CHECK(cond): the invariant checks of the fuzz targets. Not assert():
// the fuzz build may define NDEBUG, and a failed invariant must stop the run
// so that libFuzzer saves the input.
#ifndef VEMESH_FUZZ_FUZZ_CHECK_H_
#define VEMESH_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, \
                   __LINE__, #cond);                                  \
      std::abort();                                                   \
    }                                                                 \
  } while (0)

#endif  // VEMESH_FUZZ_FUZZ_CHECK_H_
