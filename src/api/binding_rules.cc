// krug/binding_rules.h: what every framework binding shares, on top of the runtime.
#include "krug/binding_rules.h"

#include <fmt/format.h>

#include "api/runtime.h"

namespace krug {

std::string unnamed_op_name(std::string_view kind, ProcessSet process_set) {
  return current_op_name_counters()->next(kind, process_set.id);
}

std::string name_or_unnamed(const std::string& name, std::string_view kind,
                            ProcessSet process_set) {
  return name.empty() ? unnamed_op_name(kind, process_set) : name;
}

}  // namespace krug
