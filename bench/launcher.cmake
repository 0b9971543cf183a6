add_executable(ddp-bench-lines launcher/lines.c)
