#pragma once
namespace ddprun {
// Both defined in the build_info.cpp that cmake/DdpBuildInfo.cmake writes at each build.
const char* version();     // the project's version, e.g. "0.1.0"
const char* git_commit();  // "c0fa8317ab12", "c0fa8317ab12-dirty", or why it is unknown
}  // namespace ddprun
