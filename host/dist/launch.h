// `anatomy --nproc N`, the torchrun-style launcher:
// Hosts the rendezvous store on a free loopback port, starts N copies of this
// command line (less --nproc) with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
// and MASTER_PORT set, and waits. A rank that dies is written to the store
// (the others name it when their collective fails); ranks still running past
// the collective timeout after a failure are stopped. Ctrl-C reaches every
// rank (the terminal sends it to all; a kill of the launcher is forwarded).
#pragma once
#include <vector>

namespace anatomy::dist {

/// Runs N copies of child_argv (this executable's command line less --nproc)
/// as ranks 0..N-1 and waits; the exit code is the first failing rank's (0
/// when all succeed, 128 + the signal when one was killed).
int launch(int nproc, const std::vector<char*>& child_argv);

}  // namespace anatomy::dist
