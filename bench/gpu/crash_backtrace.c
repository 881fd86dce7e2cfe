// A crash reporter for scripts/gpu-check, preloaded into the test runs (LD_PRELOAD): on SIGSEGV,
// SIGBUS, SIGILL, SIGFPE or SIGABRT it writes the faulting thread's native stack to stderr, one
// frame a line as "crash-backtrace[PID]: #N MODULE+0xOFFSET (SYMBOL+0xOFF)", then dies of the same
// signal. The GPU machine has no gdb, and its glibc (2.39) no longer ships libSegFault or
// catchsegv; gpu-check turns the module offsets into functions and lines with addr2line.
//
// It writes to a copy of stderr taken at load: pytest points descriptor 2 at a capture file while
// a test runs, and that file is lost with the process.
//
// Python's faulthandler (on under pytest) installs its handler after this one; on a fault it
// prints the Python stacks, puts this handler back and raises the signal again, so this one runs
// second, inside faulthandler's frames. The unwinder steps through both signal frames, so the
// frames of the original fault still appear, below the ones of the two handlers.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

enum { kMaxFrames = 128 };

static const int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

// The process's stderr as it was at load (see above); set once, before any handler can run.
static int report_fd = STDERR_FILENO;

static void say(const char* text) {
  size_t left = strlen(text);
  while (left > 0) {
    ssize_t n = write(report_fd, text, left);
    if (n <= 0) return;
    text += n;
    left -= (size_t)n;
  }
}

// One line for the code address `pc`: its module and offset, and the nearest exported symbol.
static void describe(const char* label, void* pc) {
  char line[1024];
  Dl_info info;
  memset(&info, 0, sizeof(info));
  if (dladdr(pc, &info) == 0 || info.dli_fname == NULL) {
    snprintf(line, sizeof(line), "crash-backtrace[%d]: %s %p (no module)\n", (int)getpid(), label,
             pc);
  } else {
    const uintptr_t offset = (uintptr_t)pc - (uintptr_t)info.dli_fbase;
    if (info.dli_sname != NULL)
      snprintf(line, sizeof(line), "crash-backtrace[%d]: %s %s+0x%lx (%s+0x%lx)\n", (int)getpid(),
               label, info.dli_fname, (unsigned long)offset, info.dli_sname,
               (unsigned long)((uintptr_t)pc - (uintptr_t)info.dli_saddr));
    else
      snprintf(line, sizeof(line), "crash-backtrace[%d]: %s %s+0x%lx\n", (int)getpid(), label,
               info.dli_fname, (unsigned long)offset);
  }
  say(line);
}

static void on_fatal_signal(int sig, siginfo_t* si, void* context) {
  char line[320];
  if (si->si_code > 0)
    snprintf(line, sizeof(line),
             "crash-backtrace[%d]: signal %d (%s) in thread %ld, address %p, si_code %d\n",
             (int)getpid(), sig, strsignal(sig), (long)syscall(SYS_gettid), si->si_addr,
             si->si_code);
  else
    snprintf(line, sizeof(line),
             "crash-backtrace[%d]: signal %d (%s) in thread %ld, sent by software (abort, "
             "raise, kill, or Python's faulthandler passing a fault on): no fault address; "
             "after a fault, the frame marked * after the second signal frame is where it "
             "happened\n",
             (int)getpid(), sig, strsignal(sig), (long)syscall(SYS_gettid));
  say(line);
#if defined(__x86_64__)
  // Only for a fault delivered by the kernel: after faulthandler re-raises, this context is
  // faulthandler's raise(), and the faulting instruction shows in the backtrace instead.
  if (si->si_code > 0) describe("pc", (void*)((ucontext_t*)context)->uc_mcontext.gregs[REG_RIP]);
#else
  (void)context;
#endif
  void* frames[kMaxFrames];
  const int n = backtrace(frames, kMaxFrames);
  for (int i = 0; i < n; ++i) {
    // frames[1] is the kernel's signal return trampoline. The frame after a trampoline is the
    // interrupted instruction itself ('*'); every other one is a return address, one past a call.
    const int exact = i >= 2 && n > 1 && frames[i - 1] == frames[1];
    char label[16];
    snprintf(label, sizeof(label), "#%d%s", i, exact ? "*" : "");
    describe(label, frames[i]);
  }
  say("crash-backtrace: end\n");
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  const int copy = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 100);
  if (copy >= 0) report_fd = copy;
  // backtrace() loads libgcc_s on its first call, which may allocate: do it now, not in the
  // handler.
  void* warm[1];
  backtrace(warm, 1);
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_sigaction = on_fatal_signal;
  action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i)
    sigaction(kSignals[i], &action, NULL);
}
