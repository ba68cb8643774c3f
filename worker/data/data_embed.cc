// The digits CSV, linked into the binary so the quickstart needs no download and
// no data path. BATCHDIST_DIGITS_CSV is the file CMake unpacked from
// worker/data/digits.csv.gz (see worker/data/README.md for its origin).
#include <cstddef>

#ifndef BATCHDIST_DIGITS_CSV
#error "BATCHDIST_DIGITS_CSV must name the unpacked digits CSV"
#endif

#define BATCHDIST_STR2(x) #x
#define BATCHDIST_STR(x) BATCHDIST_STR2(x)

asm(".section .rodata\n"
    ".global batchdist_digits_begin\n"
    "batchdist_digits_begin:\n"
    ".incbin \"" BATCHDIST_STR(BATCHDIST_DIGITS_CSV) "\"\n"
    ".global batchdist_digits_end\n"
    "batchdist_digits_end:\n"
    ".byte 0\n"
    ".previous\n");
