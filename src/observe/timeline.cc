#include "observe/timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "common/log.h"
#include "krug/types.h"

namespace krug::observe {
namespace {

// Row of the cycle markers; tensors get rows 1, 2, ... in order of first use.
constexpr int kCycleRow = 0;
constexpr std::string_view kCycleRowName = "cycles";

enum class Kind { kRowName, kBegin, kEnd, kInstant };

// One event as a caller queued it. Escaping and formatting happen on the writer thread so the
// engine pays only for a copy and a lock.
struct Record {
  Kind kind = Kind::kInstant;
  int row = 0;
  std::string name;  // the tensor (kRowName), the phase (kBegin/kEnd), the event (kInstant)
  int64_t ts_us = 0;
  std::string args;  // JSON object text, or empty
};

Record make_record(Kind kind, std::string name, int row = 0, std::string args = {}) {
  Record r;
  r.kind = kind;
  r.name = std::move(name);
  r.row = row;
  r.args = std::move(args);
  return r;
}

std::string json_text(const nlohmann::json& value) {
  // Replace invalid UTF-8 rather than throw: a tensor name must never break the trace.
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Caller-supplied args are embedded as given when they are a JSON object, and wrapped as a
// string otherwise, so a malformed argument cannot corrupt the file.
std::string args_text(const std::string& args) {
  auto parsed = nlohmann::json::parse(args, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) parsed = nlohmann::json{{"raw", args}};
  return json_text(parsed);
}

std::string format_event(const Record& r) {
  const std::string name = json_text(r.name);
  switch (r.kind) {
    case Kind::kRowName:
      return fmt::format(
          R"({{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":{}}}}})", r.row,
          name);
    case Kind::kBegin:
    case Kind::kEnd: {
      std::string event = fmt::format(R"({{"name":{},"ph":"{}","ts":{},"pid":{},"tid":0)", name,
                                      r.kind == Kind::kBegin ? 'B' : 'E', r.ts_us, r.row);
      if (!r.args.empty()) event += ",\"args\":" + args_text(r.args);
      return event + "}";
    }
    case Kind::kInstant:
      return fmt::format(R"({{"name":{},"ph":"i","s":"p","ts":{},"pid":{},"tid":0}})", name,
                         r.ts_us, r.row);
  }
  return {};
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

struct Timeline::Impl {
  explicit Impl(const std::string& path);
  ~Impl();

  // Queues `record` on the row of `tensor` (a new row gets its name event first).
  void push(std::string_view tensor, Record record, Clock::time_point t);
  void push_cycle(Clock::time_point t);
  void flush();

 private:
  int row_of(std::string_view tensor);  // requires mu_
  void enqueue(Record record);          // requires mu_
  void run();                           // the writer thread
  void write(const std::deque<Record>& batch);

  const std::string path_;
  std::FILE* file_;
  const Clock::time_point origin_ = Clock::now();

  std::mutex mu_;
  std::condition_variable work_cv_;  // writer waits for records or stop
  std::condition_variable done_cv_;  // flush() waits for the writer
  std::deque<Record> queue_;
  uint64_t queued_ = 0, written_ = 0;
  bool stopping_ = false;
  std::unordered_map<std::string, int, StringHash, std::equal_to<>> rows_;
  bool cycle_row_named_ = false;

  bool first_event_ = true;  // writer thread only
  bool write_failed_ = false;
  std::thread writer_;  // last: starts once everything above exists
};

Timeline::Impl::Impl(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "w")) {
  if (!file_)
    throw Error(fmt::format("cannot open timeline file '{}': {}", path,
                            std::generic_category().message(errno)));
  std::fputs("[\n", file_);
  writer_ = std::thread([this] { run(); });
}

Timeline::Impl::~Impl() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_one();
  writer_.join();
  std::fputs("\n]\n", file_);
  if (std::fclose(file_) != 0 && !write_failed_)
    log::at(log::Level::kError, -1, "timeline '{}': closing failed: {}", path_,
            std::generic_category().message(errno));
}

int Timeline::Impl::row_of(std::string_view tensor) {
  if (auto it = rows_.find(tensor); it != rows_.end()) return it->second;
  const int row = static_cast<int>(rows_.size()) + 1;
  rows_.emplace(std::string(tensor), row);
  enqueue(make_record(Kind::kRowName, std::string(tensor), row));
  return row;
}

void Timeline::Impl::enqueue(Record record) {
  queue_.push_back(std::move(record));
  ++queued_;
}

void Timeline::Impl::push(std::string_view tensor, Record record, Clock::time_point t) {
  record.ts_us = std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count());
  {
    std::lock_guard lock(mu_);
    record.row = row_of(tensor);
    enqueue(std::move(record));
  }
  work_cv_.notify_one();
}

void Timeline::Impl::push_cycle(Clock::time_point t) {
  Record record = make_record(Kind::kInstant, "CYCLE_START", kCycleRow);
  record.ts_us = std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count());
  {
    std::lock_guard lock(mu_);
    if (!cycle_row_named_) {
      enqueue(make_record(Kind::kRowName, std::string(kCycleRowName), kCycleRow));
      cycle_row_named_ = true;
    }
    enqueue(std::move(record));
  }
  work_cv_.notify_one();
}

void Timeline::Impl::flush() {
  std::unique_lock lock(mu_);
  const uint64_t target = queued_;
  done_cv_.wait(lock, [&] { return written_ >= target; });
}

void Timeline::Impl::run() {
  std::deque<Record> batch;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;  // stopping, and everything is written
      batch.swap(queue_);
    }
    write(batch);
    {
      std::lock_guard lock(mu_);
      written_ += batch.size();
    }
    batch.clear();
    done_cv_.notify_all();
  }
}

void Timeline::Impl::write(const std::deque<Record>& batch) {
  std::string text;
  for (const Record& record : batch) {
    if (!first_event_) text += ",\n";
    first_event_ = false;
    text += format_event(record);
  }
  // Flushed per batch: the writer only gets here when it was woken, so the file on disk is
  // current whenever the writer sleeps (useful when the process dies before the destructor).
  const bool ok = std::fwrite(text.data(), 1, text.size(), file_) == text.size() &&
                  std::fflush(file_) == 0;
  if (!ok && !write_failed_) {
    write_failed_ = true;  // reported once; the engine must not fail because of its trace
    log::at(log::Level::kError, -1, "timeline '{}': write failed: {}", path_,
            std::generic_category().message(errno));
  }
}

Timeline::Timeline(const std::string& path) : impl_(std::make_unique<Impl>(path)) {}
Timeline::~Timeline() = default;

void Timeline::begin(std::string_view tensor, std::string_view phase, Clock::time_point t,
                     std::string_view args_json) {
  impl_->push(tensor, make_record(Kind::kBegin, std::string(phase), 0, std::string(args_json)), t);
}

void Timeline::end(std::string_view tensor, std::string_view phase, Clock::time_point t) {
  impl_->push(tensor, make_record(Kind::kEnd, std::string(phase)), t);
}

void Timeline::instant(std::string_view tensor, std::string_view name, Clock::time_point t) {
  impl_->push(tensor, make_record(Kind::kInstant, std::string(name)), t);
}

void Timeline::mark_cycle(Clock::time_point t) { impl_->push_cycle(t); }

void Timeline::flush() { impl_->flush(); }

}  // namespace krug::observe
