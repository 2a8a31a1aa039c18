// Host logging. One small unit, compiled apart from LibTorch: PyTorch 2.x
// ships its own fmt (12) in its include folder, which Debian's spdlog (built
// on fmt 9) must never see. Callers pass finished text.
#pragma once
#include <string>

namespace anatomy::log {

/// A warning on stderr, prefixed like every host message.
void warn(const std::string& message);

}  // namespace anatomy::log
