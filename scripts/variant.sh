# Sourced by scripts/setup, main, test and bench: which LibTorch a command
# builds against, and in which folder. Reads and removes --torch=... and
# --sanitize from "$@" (the caller passes its arguments), sets:
#   torch      pypi | cuda | debian
#   sanitize   0 | 1
#   build      the build folder (ANATOMY_BUILD_DIR overrides)
#   args       the other arguments, in order
# The builds:
#   pypi    PyPI's torch wheel, its CPU half only: no nvcc, no CUDA packages
#           besides libcudart and libcupti (build/). The default on a machine
#           without an NVIDIA GPU.
#   cuda    PyPI's torch wheel with CUDA; needs the CUDA toolkit (build-cuda/).
#           The default on a machine where nvidia-smi lists a GPU.
#   debian  Debian's libtorch-dev 1.13, for machines without PyPI (build-debian/).
#   --sanitize  clang with ASan and UBSan over Debian's LibTorch (build-asan/).
anatomy_variant() {
  torch=""
  sanitize=0
  args=()
  local a
  for a in "$@"; do
    case "$a" in
      --torch=pypi|--torch=cuda|--torch=debian) torch="${a#--torch=}" ;;
      --torch=*) echo "anatomy: unknown build '$a' (expected --torch=pypi, --torch=cuda or --torch=debian)" >&2; exit 2 ;;
      --sanitize|--fuzz) sanitize=1 ;;
      *) args+=("$a") ;;
    esac
  done
  if ((sanitize)); then
    if [[ -n "$torch" && "$torch" != debian ]]; then
      echo "anatomy: --sanitize builds against Debian's LibTorch only" >&2
      exit 2
    fi
    torch=debian
    build="${ANATOMY_BUILD_DIR:-$root/build-asan}"
    return
  fi
  if [[ -z "$torch" ]]; then
    torch=pypi
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
      torch=cuda
    fi
  fi
  case "$torch" in
    pypi) build="${ANATOMY_BUILD_DIR:-$root/build}" ;;
    cuda) build="${ANATOMY_BUILD_DIR:-$root/build-cuda}" ;;
    debian) build="${ANATOMY_BUILD_DIR:-$root/build-debian}" ;;
  esac
}
