// The interactive loop: line editing and history (libedit), completion,
// auto-printed results, timing, multi-line input and Ctrl-C.
#pragma once
#include "embed/state.h"

namespace anatomy {

/// Reads, runs and prints until end of input; returns the process exit code.
/// On a terminal it edits lines with libedit; piped input is read line by line
/// with no prompt. An error prints its message and traceback and the session,
/// with its variables, goes on.
int run_repl(LuaState& state);

}  // namespace anatomy
