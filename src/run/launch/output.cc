#include "run/launch/output.h"
#include "krug/types.h"

#include <filesystem>
#include <system_error>

#include <unistd.h>

#include <cerrno>

namespace krug::run {

void LineBuffer::emit(std::string_view line, std::string& out) {
  if (rewriter_) return rewriter_->line(line, out);
  out.append(prefix_);
  out.append(line);
  out.push_back('\n');
}

void LineBuffer::feed(std::string_view data, std::string& out) {
  while (!data.empty()) {
    size_t nl = data.find('\n');
    if (nl == std::string_view::npos) {
      partial_.append(data);
      break;
    }
    if (partial_.empty()) {
      emit(data.substr(0, nl), out);
    } else {
      partial_.append(data.substr(0, nl));
      emit(partial_, out);
      partial_.clear();
    }
    data.remove_prefix(nl + 1);
  }
  while (partial_.size() >= kMaxLine) {
    emit(std::string_view(partial_).substr(0, kMaxLine), out);
    partial_.erase(0, kMaxLine);
  }
}

void LineBuffer::finish(std::string& out) {
  if (!partial_.empty()) emit(partial_, out);
  partial_.clear();
  if (rewriter_) rewriter_->finish(out);
}

std::string output_prefix(int rank, bool is_stderr) {
  return "[" + std::to_string(rank) + (is_stderr ? "]<stderr>:" : "]<stdout>:");
}

StreamPump::StreamPump(Fd pipe, int terminal_fd, std::string prefix, Fd copy_file,
                       std::unique_ptr<LineRewriter> rewriter)
    : pipe_(std::move(pipe)), terminal_fd_(terminal_fd), lines_(std::move(prefix), std::move(rewriter)),
      copy_(std::move(copy_file)) {}

void StreamPump::on_readable() {
  if (!pipe_) return;
  char buf[64 * 1024];
  ssize_t n = ::read(pipe_.get(), buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  pending_.clear();
  if (n > 0) {
    std::string_view data(buf, static_cast<size_t>(n));
    if (copy_) write_all(copy_.get(), data);
    lines_.feed(data, pending_);
  } else {
    lines_.finish(pending_);  // EOF, or an error that ends the stream just the same
    pipe_.reset();
    copy_.reset();
  }
  if (!pending_.empty()) write_all(terminal_fd_, pending_);
}

std::pair<Fd, Fd> output_files(const std::string& dir, const std::string& name) {
  if (dir.empty()) return {};
  std::filesystem::path sub = std::filesystem::path(dir) / name;
  std::error_code ec;
  std::filesystem::create_directories(sub, ec);
  if (ec) throw Error("krugrun: cannot create '" + sub.string() + "': " + ec.message());
  return {open_for_writing((sub / "stdout").string()), open_for_writing((sub / "stderr").string())};
}

}  // namespace krug::run
