// Forwarding of rank output: whole lines, prefixed "[rank]<stdout>:" so the ranks' lines never
// interleave mid-line on krugrun's own stdout / stderr.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "run/launch/fd.h"

namespace krug::run {

// Splits a byte stream into complete lines and prefixes each one. Pure; unit-tested.
// Turns complete lines into output lines, keeping state from one line to the next (krugrun
// --mpi regroups mpirun's tagged output, see run/hpc/mpi_launch.h).
class LineRewriter {
 public:
  virtual ~LineRewriter() = default;
  // Appends zero or more whole lines ('\n'-terminated) for one input line (without its '\n').
  virtual void line(std::string_view line, std::string& out) = 0;
  // End of stream: appends whatever is still held back, as whole lines.
  virtual void finish(std::string& out) = 0;
};

class LineBuffer {
 public:
  // With a `rewriter`, lines go through it instead of getting `prefix`.
  explicit LineBuffer(std::string prefix, std::unique_ptr<LineRewriter> rewriter = nullptr)
      : prefix_(std::move(prefix)), rewriter_(std::move(rewriter)) {}
  // Appends every complete line of data (prefix + line + '\n') to `out`; keeps the rest.
  void feed(std::string_view data, std::string& out);
  // End of stream: a partial last line is emitted with a newline added.
  void finish(std::string& out);

  // A line longer than this is emitted in pieces, so one rank writing without newlines cannot
  // make krugrun buffer without bound.
  static constexpr size_t kMaxLine = 1 << 20;

 private:
  void emit(std::string_view line, std::string& out);
  std::string prefix_;
  std::unique_ptr<LineRewriter> rewriter_;
  std::string partial_;
};

std::string output_prefix(int rank, bool is_stderr);  // "[3]<stderr>:"

// --output-filename DIR: DIR/<name>/stdout and DIR/<name>/stderr opened for writing (none when
// `dir` is empty). Throws krug::Error naming the directory when it cannot be created.
std::pair<Fd, Fd> output_files(const std::string& dir, const std::string& name);

// One stream of one rank: reads its pipe, writes prefixed lines to krugrun's stdout or stderr
// and, with --output-filename, the raw bytes to a file.
class StreamPump {
 public:
  StreamPump(Fd pipe, int terminal_fd, std::string prefix, Fd copy_file,
             std::unique_ptr<LineRewriter> rewriter = nullptr);
  int fd() const { return pipe_.get(); }
  bool open() const { return static_cast<bool>(pipe_); }
  // Call when poll() reports the pipe readable or hung up: forwards what one read returns;
  // at EOF flushes the partial line and closes the pipe.
  void on_readable();

 private:
  Fd pipe_;
  int terminal_fd_;
  LineBuffer lines_;
  Fd copy_;
  std::string pending_;
};

}  // namespace krug::run
