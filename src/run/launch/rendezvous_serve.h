// `krugrun __rendezvous-server [--bind ADDR]`: krug's rendezvous server alone, for launchers that
// start ranks themselves (krug.spark, krug.ray): their driver runs this, hands each rank the
// address, the port and the secret, and starts the ranks through its own engine's tasks.
//
// The secret comes from the environment (KRUG_SECRET), never the command line, where other
// users could read it. The chosen port is printed as `KRUG_RENDEZVOUS_PORT=<port>` on stdout.
// The server runs until its stdin reaches end-of-file (the driver exited or closed the pipe) or
// it is signalled; then it removes this host's shared-memory segments of KRUG_JOB_ID (left by
// ranks that died during init) and exits 0.
#pragma once

namespace krug::run {

// Returns the exit code: 0 after a clean stop, 2 on bad arguments or a missing secret.
int rendezvous_serve_main(int argc, char** argv);

}  // namespace krug::run
