// krug/binding_rules.h: what every framework binding shares, on top of the runtime.
#include "krug/binding_rules.h"

#include <fmt/format.h>

#include <array>

#include "api/runtime.h"
#include "controller/alltoall_splits.h"

namespace krug {

std::string unnamed_op_name(std::string_view kind, ProcessSet process_set) {
  return current_op_name_counters()->next(kind, process_set.id);
}

std::string name_or_unnamed(const std::string& name, std::string_view kind,
                            ProcessSet process_set) {
  return name.empty() ? unnamed_op_name(kind, process_set) : name;
}

void check_alltoall_splits(std::span<const int64_t> splits, int64_t rows, ProcessSet process_set) {
  if (splits.empty()) return;
  const size_t set_size = current_engine()->process_set_ranks(process_set.id).size();
  if (auto problem = controller::alltoall_splits_problem(splits, rows, set_size); !problem.empty())
    throw InvalidArgument(fmt::format("alltoall: {}", problem));
}

std::span<const NamedReduceOp> reduce_ops() {
  static constexpr std::array<NamedReduceOp, 6> kOps{{{"Average", ReduceOp::kAverage},
                                                      {"Sum", ReduceOp::kSum},
                                                      {"Adasum", ReduceOp::kAdasum},
                                                      {"Min", ReduceOp::kMin},
                                                      {"Max", ReduceOp::kMax},
                                                      {"Product", ReduceOp::kProduct}}};
  return kOps;
}

void report_interrupted(std::string_view what) {
  std::shared_ptr<engine::Engine> engine;
  try {
    engine = current_engine();
  } catch (const Error&) {
    return;  // not initialized (or shut down meanwhile): nobody is left to tell
  }
  engine->abort(interrupted_reason(engine->config(), what));
}

std::string interrupted_reason(const Config& config, std::string_view what) {
  return fmt::format(
      "rank {} ({}) was interrupted while waiting in {} and stopped krug on that rank; end the "
      "job, or (elastic) start a new round",
      config.rank, config.hostname, what);
}

}  // namespace krug
