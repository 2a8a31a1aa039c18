// The Hub client's machine-level half (lua/anatomy/io/hub.lua is the rest):
// one HTTP request through libcurl, and the file operations Lua lacks that
// the cache and the checkpoint series need: a symbolic or hard link, a lock
// held while a blob is fetched, a file's SHA-256 or git object id, its size,
// a folder's entries.
#include "bindings/parts.h"
#include "bindings/common.h"
#include "bindings/interrupt.h"
#include "host/io/digest.h"
#include "host/net/http.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <set>
#include <thread>

namespace anatomy::lua {
namespace {

// torch._http{method = 'GET'|'HEAD', url, headers = {'Name: value', ...},
// output = path, resume_from = n, progress = label, total = bytes,
// connect_timeout = s, stall_timeout = s, max_seconds = s, min_rate = bytes/s,
// max_bytes = n} -> {status, headers = {name = value} (names in lower case),
// body, written, appended, error, cut, too_large, too_slow}. Redirects are
// returned, not followed. Ctrl-C stops the transfer ("interrupted").
int torch_http(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  check_option_keys(L, 1, {"method", "url", "headers", "output", "resume_from", "progress", "total", "connect_timeout",
                           "stall_timeout", "max_seconds", "min_rate", "max_bytes"});
  net::HttpRequest request;
  request.method = option<std::string>(L, 1, "method").value_or("GET");
  auto url = option<std::string>(L, 1, "url");
  if (!url) throw ArgError(1, "option 'url' is required");
  request.url = *url;
  lua_getfield(L, 1, "headers");
  if (lua_istable(L, -1)) {
    size_t n = check_list_length(L, lua_gettop(L), 1, "headers");
    for (size_t i = 1; i <= n; ++i) {
      lua_rawgeti(L, -1, static_cast<int>(i));
      request.headers.push_back(check_string(L, -1));
      lua_pop(L, 1);
    }
  } else if (!lua_isnil(L, -1)) {
    throw ArgError(1, "option 'headers': a list of 'Name: value' strings expected, got " + type_name(L, -1));
  }
  lua_pop(L, 1);
  request.output = option<std::string>(L, 1, "output").value_or("");
  request.resume_from = option<int64_t>(L, 1, "resume_from").value_or(-1);
  request.progress = option<std::string>(L, 1, "progress").value_or("");
  request.total = option<int64_t>(L, 1, "total").value_or(-1);
  request.connect_timeout = option<double>(L, 1, "connect_timeout").value_or(10);
  request.stall_timeout = option<double>(L, 1, "stall_timeout").value_or(60);
  request.max_seconds = option<double>(L, 1, "max_seconds").value_or(0);
  request.min_rate = option<double>(L, 1, "min_rate").value_or(0);
  request.max_bytes = option<int64_t>(L, 1, "max_bytes").value_or(-1);
  for (double v : {request.connect_timeout, request.stall_timeout, request.max_seconds, request.min_rate})
    if (!(v >= 0) || v > 1e9) throw ArgError(1, "a timeout or rate must be a number in [0, 1e9], got " + std::to_string(v));
  request.cancelled = [] { return interrupt::pending != 0; };
  net::HttpResponse r;
  try {
    r = net::http_request(request);
  } catch (const std::runtime_error& e) {
    throw CallError(e.what());
  }
  if (r.cancelled) interrupt::raise();
  lua_createtable(L, 0, 8);
  set_number_field(L, "status", static_cast<double>(r.status));
  lua_createtable(L, 0, static_cast<int>(r.headers.size()));
  for (const auto& [name, value] : r.headers) set_string_field(L, name.c_str(), value);
  lua_setfield(L, -2, "headers");
  set_string_field(L, "body", r.body);
  set_number_field(L, "written", static_cast<double>(r.written));
  set_boolean_field(L, "appended", r.appended);
  set_boolean_field(L, "cut", r.cut);
  set_boolean_field(L, "too_large", r.too_large);
  set_boolean_field(L, "too_slow", r.too_slow);
  if (!r.error.empty()) set_string_field(L, "error", r.error);
  return 1;
}

// torch._symlink(target, path): makes path a symbolic link to target
// (replacing a link already there)
int torch_symlink(lua_State* L) {
  std::string target = check_string(L, 1), path = check_string(L, 2);
  std::string temporary = path + ".tmp." + std::to_string(::getpid());
  ::unlink(temporary.c_str());
  if (::symlink(target.c_str(), temporary.c_str()) != 0 || ::rename(temporary.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(temporary.c_str());
    throw CallError("cannot link '" + path + "' to '" + target + "': " + std::strerror(e));
  }
  return 0;
}

// torch._readlink(path) -> the target of a symbolic link, or nil when path is not one
int torch_readlink(lua_State* L) {
  std::string path = check_string(L, 1);
  std::vector<char> buffer(4096);
  ssize_t n = ::readlink(path.c_str(), buffer.data(), buffer.size());
  if (n < 0 || static_cast<size_t>(n) >= buffer.size()) lua_pushnil(L);
  else lua_pushlstring(L, buffer.data(), static_cast<size_t>(n));
  return 1;
}

// torch._lock(path, label) -> lock: an exclusive flock on path (made if
// absent), waited for while another process holds it (a line on stderr says
// so once, naming label); Ctrl-C stops the wait. The lock file is opened
// without following a link and must be a regular file. lock:release() frees it, as
// does the collector. A path this process already holds is an error, not a
// wait: flock locks of two opens of one file exclude each other even within
// one process, so a second lock here would wait for ever.
struct FileLock {
  int fd = -1;
  std::string path;
};
constexpr const char* kLockType = "anatomy.FileLock";

std::set<std::string>& held_locks() {
  static std::set<std::string> held;
  return held;
}

void release(FileLock* lock) {
  if (lock->fd < 0) return;
  ::flock(lock->fd, LOCK_UN);
  ::close(lock->fd);
  lock->fd = -1;
  held_locks().erase(lock->path);
}

int torch_lock(lua_State* L) {
  std::string path = check_string(L, 1);
  std::string label = lua_isstring(L, 2) ? lua_tostring(L, 2) : path;
  if (held_locks().count(path)) throw CallError("this process already holds the lock '" + path + "'");
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0)
    throw CallError("cannot open the lock '" + path + "': " +
                    (errno == ELOOP ? std::string("it is a symbolic link") : std::string(std::strerror(errno))));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw CallError("cannot open the lock '" + path + "': it is not a regular file");
  }
  bool said = false;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      int e = errno;
      ::close(fd);
      throw CallError("cannot lock '" + path + "': " + std::strerror(e));
    }
    if (!said) {
      std::fprintf(stderr, "anatomy: waiting for another process that is fetching %s\n", label.c_str());
      said = true;
    }
    if (interrupt::pending) {
      ::close(fd);
      interrupt::raise();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto* lock = static_cast<FileLock*>(lua_newuserdata(L, sizeof(FileLock)));
  new (lock) FileLock{fd, path};
  held_locks().insert(path);
  luaL_getmetatable(L, kLockType);
  lua_setmetatable(L, -2);
  return 1;
}

// lock:release(): frees the lock (again is harmless)
int lock_release(lua_State* L) {
  auto* lock = static_cast<FileLock*>(luaL_checkudata(L, 1, kLockType));
  release(lock);
  return 0;
}

int lock_gc(lua_State* L) {
  auto* lock = static_cast<FileLock*>(luaL_checkudata(L, 1, kLockType));
  release(lock);
  lock->~FileLock();
  return 0;
}

// torch._file_digest(path, 'sha256'|'git-sha1') -> lowercase hex
int torch_file_digest(lua_State* L) {
  try {
    lua_pushstring(L, io::file_digest(check_string(L, 1), check_string(L, 2)).c_str());
  } catch (const std::runtime_error& e) {
    throw CallError(e.what());
  }
  return 1;
}

// torch._file_size(path) -> bytes, or nil when path does not exist
int torch_file_size(lua_State* L) {
  struct stat st {};
  if (::stat(check_string(L, 1).c_str(), &st) != 0) lua_pushnil(L);
  else lua_pushnumber(L, static_cast<lua_Number>(st.st_size));
  return 1;
}

// torch._hardlink(path, link): link names path's file too (a checkpoint kept
// by step costs no copy; a later rename over path leaves link as it was)
int torch_hardlink(lua_State* L) {
  std::string path = check_string(L, 1), link = check_string(L, 2);
  ::unlink(link.c_str());
  if (::link(path.c_str(), link.c_str()) != 0)
    throw CallError("cannot link '" + link + "' to '" + path + "': " + std::strerror(errno));
  return 0;
}

// torch._lstat_kind(path) -> 'file', 'directory', 'link', 'fifo', 'socket',
// 'character device' or 'block device' (of path itself, a link not
// followed), or nil when nothing is there
int torch_lstat_kind(lua_State* L) {
  struct stat st {};
  if (::lstat(check_string(L, 1).c_str(), &st) != 0) {
    lua_pushnil(L);
    return 1;
  }
  const char* kind = S_ISREG(st.st_mode) ? "file" : S_ISDIR(st.st_mode) ? "directory" : S_ISLNK(st.st_mode) ? "link"
                     : S_ISFIFO(st.st_mode) ? "fifo" : S_ISSOCK(st.st_mode) ? "socket"
                     : S_ISCHR(st.st_mode) ? "character device" : "block device";
  lua_pushstring(L, kind);
  return 1;
}

// torch._mkdir(path) -> true when it made the folder, false when a folder
// is already there; an error when something else is there (a link to a
// folder included) or it cannot be made. One level: the parent must exist.
int torch_mkdir(lua_State* L) {
  std::string path = check_string(L, 1);
  if (::mkdir(path.c_str(), 0755) == 0) {
    lua_pushboolean(L, 1);
    return 1;
  }
  int e = errno;
  struct stat st {};
  if (e == EEXIST && ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (e == EEXIST) throw CallError("cannot make the folder '" + path + "': something that is not a folder is there");
  throw CallError("cannot make the folder '" + path + "': " + std::strerror(e));
}

// torch._realpath(path) -> the path with every link and . or .. resolved, or
// nil when it does not exist
int torch_realpath(lua_State* L) {
  std::unique_ptr<char, decltype(&std::free)> resolved(::realpath(check_string(L, 1).c_str(), nullptr), &std::free);
  if (resolved) lua_pushstring(L, resolved.get());
  else lua_pushnil(L);
  return 1;
}

// torch._list_dir(path) -> the names in a folder, sorted, without . and ..
int torch_list_dir(lua_State* L) {
  std::string path = check_string(L, 1);
  struct Close {
    void operator()(DIR* d) const { ::closedir(d); }
  };
  std::unique_ptr<DIR, Close> dir(::opendir(path.c_str()));
  if (!dir) throw CallError("cannot list '" + path + "': " + std::strerror(errno));
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(dir.get())) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  lua_createtable(L, static_cast<int>(names.size()), 0);
  for (size_t i = 0; i < names.size(); ++i) {
    lua_pushlstring(L, names[i].data(), names[i].size());
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 1;
}

const luaL_Reg functions[] = {
    {"_hardlink", guarded<torch_hardlink>},
    {"_list_dir", guarded<torch_list_dir>},
    {"_http", guarded<torch_http>},
    {"_symlink", guarded<torch_symlink>},
    {"_readlink", guarded<torch_readlink>},
    {"_lock", guarded<torch_lock>},
    {"_file_digest", guarded<torch_file_digest>},
    {"_file_size", guarded<torch_file_size>},
    {"_lstat_kind", guarded<torch_lstat_kind>},
    {"_realpath", guarded<torch_realpath>},
    {"_mkdir", guarded<torch_mkdir>},
    {nullptr, nullptr},
};

}  // namespace

/// Adds _http, _symlink, _readlink, _hardlink, _lock (its lock userdata, anatomy.FileLock), _file_digest, _file_size, _lstat_kind, _realpath, _mkdir and _list_dir to the torch table at index torch.
void register_http(lua_State* L, int torch) {
  luaL_newmetatable(L, kLockType);
  lua_pushvalue(L, -1);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, guarded<lock_release>);
  lua_setfield(L, -2, "release");
  lua_pushcfunction(L, guarded<lock_gc>);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  lua_pushvalue(L, torch);
  luaL_register(L, nullptr, functions);
  lua_pop(L, 1);
}

}  // namespace anatomy::lua
