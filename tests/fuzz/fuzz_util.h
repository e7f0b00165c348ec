/* Helpers shared by the libFuzzer targets in tests/fuzz/ (built by CMakeLists.txt's fuzz
 * section with clang -fsanitize=fuzzer,address,undefined,float-cast-overflow).
 *
 * kvplan's readers take file paths, so each input is put into an anonymous in-memory file
 * (memfd_create(2)) and handed over as /proc/self/fd/N: a regular file that never touches the
 * disk, readable like a model file. memfd_create needs _GNU_SOURCE (set by CMakeLists.txt). */
#ifndef KVPLAN_FUZZ_UTIL_H
#define KVPLAN_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* An in-memory file holding `n` bytes of `data`; *path gets its name. Returns the descriptor
 * (close it when done) or -1. */
static inline int fz_memfile(const char *name, const uint8_t *data, size_t n, char path[64]) {
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) return -1;
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, data + off, n - off);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)w;
    }
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
