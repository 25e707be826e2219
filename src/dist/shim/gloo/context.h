// Declarations only: see README.md. ProcessGroupGloo.hpp's inline
// setTimeout calls this member; the shim never calls it.
#pragma once
#include <chrono>
namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
} // namespace gloo
