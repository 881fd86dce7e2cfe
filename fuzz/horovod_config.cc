// horovodrun's --config-file (run/cli/horovod_config.h) on untrusted text, as
// load_horovod_config reads it: any text parses or throws krug::Error naming where and why.
#include "run/cli/horovod_config.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "krug/types.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    krug::run::parse_horovod_config(std::string(reinterpret_cast<const char*>(data), size),
                                    "config.yaml");
  } catch (const krug::Error&) {
  }
  return 0;
}
