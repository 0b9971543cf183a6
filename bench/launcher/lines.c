/* Writes N short lines to stdout as fast as stdio can: the output benchmark's C worker. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  long n = argc > 1 ? atol(argv[1]) : 500000;
  const char* rank = getenv("RANK");
  static char buf[1 << 16];
  setvbuf(stdout, buf, _IOFBF, sizeof buf);
  for (long i = 0; i < n; ++i) printf("rank %s line %ld\n", rank ? rank : "?", i);
  return 0;
}
