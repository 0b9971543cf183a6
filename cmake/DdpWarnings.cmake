# Warnings applied to every target of this project (not to consumers of the package).
add_library(ddp_warnings INTERFACE)
target_compile_options(ddp_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
