// anatomy as a Jupyter kernel: the messaging protocol (5.3) over ZeroMQ with
// HMAC-SHA256 signatures, and the kernelspec that makes Jupyter find it.
// What a request does is Lua's (lua/anatomy/session/kernel.lua): cells run in the
// same globals and way as REPL lines.
#pragma once
#include <string>

namespace anatomy {

class LuaState;

/// Serves the kernel described by a connection file until a shutdown
/// request; returns the exit status. Throws std::runtime_error when the file
/// cannot be read or a socket cannot be bound.
int run_kernel(LuaState& state, const std::string& connection_file);

/// Writes the kernelspec (kernel.json and a logo) under
/// `prefix`/share/jupyter/kernels/anatomy, or the user's folder
/// (~/.local/share/jupyter/kernels/anatomy) when prefix is empty and user is
/// true, or /usr/local/share/jupyter/kernels/anatomy. Returns the folder.
std::string install_kernelspec(const std::string& executable, bool user, const std::string& prefix);

}  // namespace anatomy
