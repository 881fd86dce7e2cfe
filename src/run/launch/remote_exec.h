// The remote half of an ssh-started rank: `krugrun __remote-exec [--cwd DIR] -- command...`, run
// by ssh on the rank's host. It first reads the rank's environment from stdin
// (run/launch/env_block.h).
//
// Without it a remote rank would outlive its ssh session: sshd does not signal a command that
// has no terminal. The wrapper starts the command in its own process group and stops that group
// (SIGTERM, SIGKILL after a grace) as soon as its stdin, which ssh feeds from a pipe krugrun
// holds open, reaches end-of-file: krugrun exited, ssh was killed, or the link died.
#pragma once

namespace krug::run {

// Returns the exit code to leave with: the command's status, 128 + signal if it was killed,
// 126/127 when it cannot be started (with a message on stderr).
int remote_exec_main(int argc, char** argv);

}  // namespace krug::run
