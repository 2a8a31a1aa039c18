// The logging unit (see log.h): the only translation unit that includes spdlog.
#include "host/log/log.h"

#include <spdlog/spdlog.h>

namespace anatomy::log {

void warn(const std::string& message) { spdlog::warn("{}", message); }

}  // namespace anatomy::log
