// krugrun's signals arrive through a signalfd read in the supervisor's poll loop, so child exits
// and Ctrl-C are handled in one place without async handlers.
#pragma once

#include "run/launch/fd.h"

namespace krug::run {

// Blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP in the calling thread and ignores SIGPIPE. Call
// first in main(), before any thread exists, so every later thread inherits the mask and no
// thread takes the default (fatal) action for these signals.
void block_supervised_signals();

// A non-blocking signalfd for the signals blocked above.
Fd open_signal_fd();

}  // namespace krug::run
