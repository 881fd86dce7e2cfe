// Test helper: runs the real krugrun as a child of the test, output in temp files, and finds
// processes a job left behind. Shared by the multi-process test binaries.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace krug::testing {

namespace fs = std::filesystem;

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string line; std::getline(ss, line);) out.push_back(line);
  return out;
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A unique string per job, put into ranks' environments to find their processes in /proc.
inline std::string unique_marker(const std::string& prefix = "krugtest") {
  std::random_device rd;
  return prefix + std::to_string(::getpid()) + "x" + std::to_string(rd());
}

// Processes (other than the test's own) whose environment contains `marker`. A zombie has an
// empty environ: it is dead already, not an orphan.
inline int count_processes_with(const std::string& marker) {
  int count = 0;
  std::error_code ec;  // processes come and go while we look
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (std::stoi(name) == ::getpid()) continue;
    if (contains(read_file(entry.path() / "environ"), marker)) ++count;
  }
  return count;
}

// Polls `done` every 10 ms until it holds; false after 60 s, which only guards against a hang.
inline bool wait_until(const std::function<bool()>& done) {
  for (int i = 0; i < 6000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// Waits until at least `n` processes carry the marker (ranks started).
inline bool wait_for_processes(const std::string& marker, int n) {
  return wait_until([&] { return count_processes_with(marker) >= n; });
}

// Waits until no process carries the marker.
inline bool wait_for_no_process(const std::string& marker) {
  return wait_until([&] { return count_processes_with(marker) == 0; });
}

// A stand-in for ssh, first on PATH while it lives: records each call's arguments and runs the
// remote command through /bin/sh on this machine, as sshd runs it through the user's shell. Jobs
// then take krugrun's real ssh path without a server.
class FakeSsh {
 public:
  // Each call writes a file of its own (calls.XXXXXX: its arguments, one per line, and
  // calls.XXXXXX.env: KRUG_SECRET as it saw it): ssh runs concurrently, one per host, and
  // lines appended to one shared file by several calls would interleave.
  FakeSsh() : dir_(fs::temp_directory_path() / unique_marker("fakessh")) {
    fs::create_directories(dir_);
    std::ofstream(dir_ / "ssh") << "#!/bin/sh\n"
                                   "log=$(mktemp \"$FAKE_SSH_LOG.XXXXXX\")\n"
                                   "for a; do printf '%s\\n' \"$a\"; done > \"$log\"\n"
                                   "echo \"KRUG_SECRET=${KRUG_SECRET-(unset)}\" > \"$log.env\"\n"
                                   "for a; do last=$a; done\n"
                                   "exec /bin/sh -c \"$last\"\n";
    fs::permissions(dir_ / "ssh", fs::perms::owner_all);
    const char* path = std::getenv("PATH");
    old_path_ = path ? path : "/usr/bin:/bin";
    ::setenv("PATH", (dir_.string() + ":" + old_path_).c_str(), 1);
    ::setenv("FAKE_SSH_LOG", (dir_ / "calls").c_str(), 1);
  }
  FakeSsh(const FakeSsh&) = delete;
  FakeSsh& operator=(const FakeSsh&) = delete;
  ~FakeSsh() {
    ::setenv("PATH", old_path_.c_str(), 1);
    ::unsetenv("FAKE_SSH_LOG");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // KRUG_SECRET in each call's own environment, as "KRUG_SECRET=value" or "KRUG_SECRET=(unset)".
  std::vector<std::string> secrets_in_environment() const {
    std::vector<std::string> out;
    for (const auto& file : logs(true))
      for (const auto& line : lines_of(read_file(file))) out.push_back(line);
    return out;
  }

  // Every call's arguments (calls run concurrently: in no particular order).
  std::vector<std::vector<std::string>> calls() const {
    std::vector<std::vector<std::string>> out;
    for (const auto& file : logs(false)) out.push_back(lines_of(read_file(file)));
    return out;
  }

 private:
  // The calls' files: their environments' (*.env) or their arguments'.
  std::vector<fs::path> logs(bool env) const {
    std::vector<fs::path> out;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("calls.", 0) == 0 && name.ends_with(".env") == env) out.push_back(entry.path());
    }
    return out;
  }

  fs::path dir_;
  std::string old_path_;
};

// `krugrun args...` as a child process with stdout/stderr in files. Killed (with its ranks,
// which die with krugrun) if still running when destroyed or when wait() times out.
class KrugrunProcess {
 public:
  // With `stdin_pipe`, krugrun's stdin is a pipe the test holds open until close_stdin() (as ssh
  // feeds the remote wrapper); otherwise /dev/null.
  KrugrunProcess(const std::string& krugrun, const std::vector<std::string>& args,
                 bool stdin_pipe = false) {
    dir_ = fs::temp_directory_path() / unique_marker("krugrun");
    int in_pipe[2] = {-1, -1};
    if (stdin_pipe && ::pipe(in_pipe) != 0) in_pipe[0] = in_pipe[1] = -1;
    fs::create_directories(dir_ / "ompi");
    // Made before fork: the child may only call async-signal-safe functions.
    std::vector<std::string> env = environment_with_own_mpi_session_dir(dir_ / "ompi");
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    start_ = std::chrono::steady_clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      int out = ::open((dir_ / "out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open((dir_ / "err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int in = in_pipe[0] >= 0 ? in_pipe[0] : ::open("/dev/null", O_RDONLY);
      ::dup2(in, 0);
      if (in_pipe[1] >= 0) ::close(in_pipe[1]);
      ::dup2(out, 1);
      ::dup2(err, 2);
      std::vector<char*> argv{const_cast<char*>(krugrun.c_str())};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execve(krugrun.c_str(), argv.data(), envp.data());
      ::_exit(126);
    }
    if (in_pipe[0] >= 0) ::close(in_pipe[0]);
    stdin_write_ = in_pipe[1];
  }
  void close_stdin() {
    if (stdin_write_ >= 0) ::close(stdin_write_);
    stdin_write_ = -1;
  }
  // Writes `data` to krugrun's stdin pipe (small writes: the pipe holds them).
  void write_stdin(const std::string& data) {
    if (stdin_write_ >= 0) {
      ssize_t ignored = ::write(stdin_write_, data.data(), data.size());
      (void)ignored;
    }
  }
  // This process's environment, with Open MPI's session directory in `dir` unless the caller
  // chose one. Open MPI 4 keeps every job's session directory under one directory per user
  // (/tmp/ompi.<host>.<uid>), which a job that ends removes: another job starting at that moment
  // fails to create its own there (open-mpi/ompi#8510), as ctest -j runs mpirun jobs.
  static std::vector<std::string> environment_with_own_mpi_session_dir(const fs::path& dir) {
    static constexpr std::string_view kName = "OMPI_MCA_orte_tmpdir_base=";
    std::vector<std::string> env;
    bool chosen = false;
    for (char** e = environ; *e != nullptr; ++e) {
      env.emplace_back(*e);
      chosen = chosen || env.back().starts_with(kName);
    }
    if (!chosen) env.push_back(std::string(kName) + dir.string());
    return env;
  }

  KrugrunProcess(const KrugrunProcess&) = delete;
  KrugrunProcess& operator=(const KrugrunProcess&) = delete;
  ~KrugrunProcess() {
    close_stdin();
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // krugrun's exit code (128 + signal if it was killed); -1 on timeout (it is then killed).
  int wait(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        elapsed_ = std::chrono::steady_clock::now() - start_;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // test code: simple polling
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    exited_ = true;
    return -1;
  }

  pid_t pid() const { return pid_; }
  std::string out() const { return read_file(dir_ / "out"); }
  std::string err() const { return read_file(dir_ / "err"); }
  // Both streams, the tail only: enough to see what went wrong in a failure message.
  std::string output() const {
    std::string all = "--- stdout ---\n" + out() + "--- stderr ---\n" + err();
    return all.size() > 12000 ? "...\n" + all.substr(all.size() - 12000) : all;
  }
  double seconds() const { return std::chrono::duration<double>(elapsed_).count(); }
  fs::path dir() const { return dir_; }

  // Lines rank `r` printed on stdout, without krugrun's "[r]<stdout>:" prefix.
  std::vector<std::string> rank_lines(int r) const {
    const std::string prefix = "[" + std::to_string(r) + "]<stdout>:";
    std::vector<std::string> lines;
    for (const auto& line : lines_of(out()))
      if (line.rfind(prefix, 0) == 0) lines.push_back(line.substr(prefix.size()));
    return lines;
  }
  bool rank_printed(int r, const std::string& text) const {
    for (const auto& line : rank_lines(r))
      if (contains(line, text)) return true;
    return false;
  }

 private:
  fs::path dir_;
  pid_t pid_ = -1;
  int stdin_write_ = -1;
  bool exited_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::duration elapsed_{};
};

// A finished `krugrun -np N <program>`: its exit code (-1 when it ran past the timeout and was
// killed) and its output.
struct JobResult {
  std::unique_ptr<KrugrunProcess> job;
  int code = -1;
  const KrugrunProcess* operator->() const { return job.get(); }
};

inline JobResult run_job(const std::string& krugrun, int np,
                         const std::vector<std::string>& program,
                         std::chrono::seconds timeout) {
  std::vector<std::string> args{"-np", std::to_string(np)};
  args.insert(args.end(), program.begin(), program.end());
  JobResult run{std::make_unique<KrugrunProcess>(krugrun, args)};
  run.code = run.job->wait(timeout);
  return run;
}

// The accuracy that rank 0's final line (final_line's first group) reports; -1 when no line
// matches.
inline double final_accuracy(const JobResult& run, const std::regex& final_line) {
  std::smatch m;
  const std::string out = run->out();
  return std::regex_search(out, m, final_line) ? std::stod(m[1]) : -1.0;
}

}  // namespace krug::testing
