// The floor of the cold-start benchmark: a C++ program that links LibTorch,
// calls into it once (so the link is kept) and leaves without running static
// destructors, as `anatomy` does. Its run time is what loading LibTorch and
// its shared libraries costs any program on this machine.
#include <ATen/Context.h>

#include <cstdlib>

int main() {
  volatile bool mkldnn = at::globalContext().userEnabledMkldnn();
  (void)mkldnn;
  std::_Exit(0);
}
