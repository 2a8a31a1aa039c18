// The Catch2 main, in a translation unit of its own so it compiles once.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
