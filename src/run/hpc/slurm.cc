#include "run/hpc/slurm.h"

#include <charconv>
#include <cstdint>
#include <set>

#include "krug/types.h"

namespace krug::run::slurm {
namespace {

// A typo such as "n[0-999999999]" must fail, not exhaust memory.
constexpr size_t kMaxHosts = 1 << 20;

std::string quoted(std::string_view s) {
  return "'" + std::string(s) + "'";
}

bool parse_uint(std::string_view s, uint64_t& out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

// Splits on commas that are not inside brackets.
std::vector<std::string_view> split_top_level(std::string_view s) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '[') ++depth;
    if (s[i] == ']') --depth;
    if (s[i] == ',' && depth == 0) {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  parts.push_back(s.substr(start));
  return parts;
}

// "01-03,07" -> 01 02 03 07: the numbers one bracket group stands for.
std::vector<std::string> expand_ranges(std::string_view ranges, std::string_view expression) {
  auto fail = [&](const std::string& why) {
    return Error("krugrun: bad Slurm hostlist " + quoted(expression) + ": " + why);
  };
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = ranges.find(',', start);
    std::string_view item =
        ranges.substr(start, comma == ranges.npos ? ranges.npos : comma - start);
    size_t dash = item.find('-');
    std::string_view lo = item.substr(0, dash);
    std::string_view hi = dash == item.npos ? lo : item.substr(dash + 1);
    uint64_t a = 0, b = 0;
    if (!parse_uint(lo, a) || !parse_uint(hi, b))
      throw fail("range " + quoted(item) + " is not N or N-M with decimal numbers");
    if (a > b) throw fail("range " + quoted(item) + " runs backwards");
    if (b - a >= kMaxHosts || out.size() + (b - a + 1) > kMaxHosts)
      throw fail("more than " + std::to_string(kMaxHosts) + " hosts");
    // Slurm pads every number of a range to the width of its lower bound: [08-10] -> 08 09 10.
    for (uint64_t v = a; v <= b; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      out.push_back(std::move(digits));
    }
    if (comma == ranges.npos) break;
    start = comma + 1;
  }
  return out;
}

// One top-level entry: text and bracket groups, multiplied out left to right.
void expand_entry(std::string_view entry, std::string_view expression,
                  std::vector<std::string>& out) {
  auto fail = [&](const std::string& why) {
    return Error("krugrun: bad Slurm hostlist " + quoted(expression) + ": " + why);
  };
  if (entry.empty()) throw fail("empty host name");
  std::vector<std::string> names{""};
  size_t i = 0;
  while (i < entry.size()) {
    size_t open = entry.find_first_of("[]", i);
    if (open != entry.npos && entry[open] == ']') throw fail("']' without '[' in " + quoted(entry));
    std::string_view text = entry.substr(i, open == entry.npos ? entry.npos : open - i);
    for (auto& n : names) n += text;
    if (open == entry.npos) break;
    size_t close = entry.find_first_of("[]", open + 1);
    if (close == entry.npos || entry[close] == '[')
      throw fail("'[' without matching ']' in " + quoted(entry));
    std::string_view ranges = entry.substr(open + 1, close - open - 1);
    if (ranges.empty()) throw fail("empty brackets in " + quoted(entry));
    std::vector<std::string> numbers = expand_ranges(ranges, expression);
    if (names.size() * numbers.size() + out.size() > kMaxHosts)
      throw fail("more than " + std::to_string(kMaxHosts) + " hosts");
    std::vector<std::string> product;
    product.reserve(names.size() * numbers.size());
    for (const auto& n : names)
      for (const auto& number : numbers) product.push_back(n + number);
    names = std::move(product);
    i = close + 1;
  }
  for (auto& n : names) out.push_back(std::move(n));
}

std::optional<std::string> lookup(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

// "krugrun: SLURM_X: <what the parser said>", for an error in the value of variable `var`.
Error in_variable(const char* var, const Error& e) {
  std::string_view what = e.what();
  constexpr std::string_view kPrefix = "krugrun: ";
  if (what.substr(0, kPrefix.size()) == kPrefix) what.remove_prefix(kPrefix.size());
  return Error("krugrun: " + std::string(var) + ": " + std::string(what));
}

std::string describe(const Allocation& a) {
  std::string hosts;
  for (const auto& h : a.hosts)
    hosts += (hosts.empty() ? "" : ",") + h.host + ":" + std::to_string(h.slots);
  return "job " + a.job_id + " has " + std::to_string(a.total_slots()) + " task slot(s): " + hosts;
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view expression) {
  if (expression.empty()) throw Error("krugrun: empty Slurm hostlist");
  std::vector<std::string> out;
  for (std::string_view entry : split_top_level(expression)) expand_entry(entry, expression, out);
  return out;
}

std::vector<int> expand_counts(std::string_view spec) {
  auto fail = [&](const std::string& why) {
    return Error("krugrun: bad Slurm per-node count list " + quoted(spec) + ": " + why +
                 "; expected N or N(xM) items separated by commas, e.g. 2(x3),1");
  };
  if (spec.empty()) throw fail("empty");
  std::vector<int> out;
  size_t start = 0;
  while (true) {
    size_t comma = spec.find(',', start);
    std::string_view item = spec.substr(start, comma == spec.npos ? spec.npos : comma - start);
    std::string_view count = item, repeat = "1";
    if (size_t paren = item.find('('); paren != item.npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')')
        throw fail("item " + quoted(item) + " is not N(xM)");
      count = item.substr(0, paren);
      repeat = item.substr(paren + 2, item.size() - paren - 3);
    }
    uint64_t n = 0, times = 0;
    if (!parse_uint(count, n) || !parse_uint(repeat, times))
      throw fail("item " + quoted(item) + " is not a number");
    if (n < 1 || n > INT32_MAX || times < 1)
      throw fail("item " + quoted(item) + " is not positive");
    if (times > kMaxHosts || out.size() + times > kMaxHosts)
      throw fail("more than " + std::to_string(kMaxHosts) + " nodes");
    out.insert(out.end(), times, static_cast<int>(n));
    if (comma == spec.npos) break;
    start = comma + 1;
  }
  return out;
}

int Allocation::total_slots() const {
  int64_t total = 0;
  for (const auto& h : hosts) total += h.slots;
  return total > INT32_MAX ? INT32_MAX : static_cast<int>(total);
}

namespace {

// Tasks (or CPUs) per node of an allocation, and the variable they came from.
struct SlotCounts {
  std::vector<int> counts;
  const char* variable;
  std::string spec;
  int cpus_per_task = 1;  // CPUs divide by it; task counts are already slots
};

SlotCounts read_slot_counts(const std::map<std::string, std::string>& env,
                            const std::string& job_id) {
  SlotCounts out;
  // Inside a job step, SLURM_TASKS_PER_NODE describes the step; the job's CPUs are still there.
  out.variable = "SLURM_TASKS_PER_NODE";
  std::optional<std::string> spec;
  if (!lookup(env, "SLURM_STEP_ID")) spec = lookup(env, out.variable);
  if (!spec) {
    spec = lookup(env, out.variable = "SLURM_JOB_CPUS_PER_NODE");
    if (auto cpt = lookup(env, "SLURM_CPUS_PER_TASK")) {
      uint64_t v = 0;
      if (!parse_uint(*cpt, v) || v < 1 || v > INT32_MAX)
        throw Error("krugrun: SLURM_CPUS_PER_TASK=" + quoted(*cpt) + " is not a positive number");
      out.cpus_per_task = static_cast<int>(v);
    }
  }
  if (!spec)
    throw Error("krugrun: inside Slurm job " + job_id +
                " but neither SLURM_TASKS_PER_NODE nor SLURM_JOB_CPUS_PER_NODE is set; give the "
                "hosts with -H host:slots,...");
  out.spec = *spec;
  try {
    out.counts = expand_counts(out.spec);
  } catch (const Error& e) {
    throw in_variable(out.variable, e);
  }
  return out;
}

}  // namespace

std::optional<Allocation> detect_allocation(const std::map<std::string, std::string>& env) {
  std::optional<std::string> job_id = lookup(env, "SLURM_JOB_ID");
  if (!job_id) job_id = lookup(env, "SLURM_JOBID");
  if (!job_id) return std::nullopt;

  const char* list_var = "SLURM_JOB_NODELIST";
  std::optional<std::string> nodelist = lookup(env, list_var);
  if (!nodelist) nodelist = lookup(env, list_var = "SLURM_NODELIST");
  if (!nodelist)
    throw Error("krugrun: inside Slurm job " + *job_id +
                " but neither SLURM_JOB_NODELIST nor SLURM_NODELIST is set; give the hosts "
                "with -H host:slots,...");

  std::vector<std::string> names;
  try {
    names = expand_hostlist(*nodelist);
  } catch (const Error& e) {
    throw in_variable(list_var, e);
  }

  const SlotCounts slots = read_slot_counts(env, *job_id);
  const std::vector<int>& counts = slots.counts;
  const char* count_var = slots.variable;
  const int cpus_per_task = slots.cpus_per_task;
  if (counts.size() != names.size())
    throw Error("krugrun: Slurm job " + *job_id + ": " + list_var + "=" + quoted(*nodelist) +
                " names " + std::to_string(names.size()) + " node(s) but " + count_var + "=" +
                quoted(slots.spec) + " gives " + std::to_string(counts.size()) + " count(s)");

  Allocation a;
  a.job_id = *job_id;
  std::set<std::string> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!seen.insert(names[i]).second)
      throw Error("krugrun: Slurm job " + *job_id + ": " + list_var + " names host " +
                  quoted(names[i]) + " twice");
    int slots = counts[i] / cpus_per_task;
    if (slots < 1)
      throw Error("krugrun: Slurm job " + *job_id + ": host " + names[i] + " has " +
                  std::to_string(counts[i]) +
                  " CPU(s), fewer than SLURM_CPUS_PER_TASK=" + std::to_string(cpus_per_task));
    a.hosts.push_back({names[i], slots});
  }
  return a;
}

int ranks_to_start(const Allocation& allocation, std::optional<int> requested_np) {
  if (!requested_np) return allocation.total_slots();
  int np = *requested_np;
  if (np < 1) throw Error("krugrun: -np must be at least 1 (got " + std::to_string(np) + ")");
  if (np > allocation.total_slots())
    throw Error("krugrun: -np " + std::to_string(np) +
                " exceeds the Slurm allocation: " + describe(allocation) +
                ". Ask Slurm for more tasks (sbatch/salloc --ntasks=" + std::to_string(np) +
                "), lower -np, or leave -np out to use every slot.");
  return np;
}

std::vector<std::string> srun_argv(const std::string& job_id, int rank, const std::string& host,
                                   const std::vector<std::string>& command) {
  // Explicit counts win over SLURM_NTASKS, SLURM_NNODES and SLURM_NTASKS_PER_NODE inherited
  // from the batch script, which srun would otherwise read as its own options.
  std::vector<std::string> argv{"srun",
                                "--jobid=" + job_id,
                                "--nodes=1",
                                "--ntasks=1",
                                "--ntasks-per-node=1",
                                "--nodelist=" + host,
                                "--job-name=krug-rank" + std::to_string(rank),
                                "--overlap",
                                "--export=ALL",
                                "--input=none",
                                "--quiet",
                                "--"};
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

}  // namespace krug::run::slurm
