// The machine's memory, for the size checks made before allocating (docs/cli.md, "Sizes").
#pragma once

#include <cstdint>
#include <string>

namespace gradscope {

// Physical memory in bytes; 0 when the system does not say.
double host_memory_bytes();

// "12.3 GiB"
std::string format_gib(double bytes);

}  // namespace gradscope
