// The job spec file of `krugrun --config` (run/cli/job_spec.h) on untrusted text, as
// load_job_spec reads it: any text parses or throws krug::Error naming where and why.
#include "run/cli/job_spec.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "krug/types.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    krug::run::parse_job_spec(std::string(reinterpret_cast<const char*>(data), size), "job.yaml");
  } catch (const krug::Error&) {
  }
  return 0;
}
