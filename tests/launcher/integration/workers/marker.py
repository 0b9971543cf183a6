"""Creates the file named by argv[1]: proves a worker was started."""
import sys

open(sys.argv[1], "a").close()
