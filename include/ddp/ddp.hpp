// libddp umbrella header: everything a C++ worker needs to join a ddprun job.
#pragma once

#include "ddp/collectives.hpp"
#include "ddp/error.hpp"
#include "ddp/error_file.hpp"
#include "ddp/nccl.hpp"
#include "ddp/process_group.hpp"
#include "ddp/store.hpp"
#include "ddp/tcp_store.hpp"
#include "ddp/types.hpp"
