// Reads a JSONL trace written with --trace (one line per step, one per lifecycle event) and tells the
// life of one request: its lifecycle events and every row it had in a step, in order.
#pragma once

#include <istream>
#include <string>
#include <vector>

namespace jambo {

// One line per event or row of the request, e.g.
// "step 12  prefill  sample 0  positions 0..15 (16 tokens)  slot 7 gen 3  kv blocks [4, 5]".
// Lines that are not JSON objects are counted in num_unreadable rather than stopping the read.
struct RequestLife {
  std::vector<std::string> lines;
  int64_t num_unreadable = 0;
};

RequestLife read_request_life(std::istream& trace, const std::string& request_id);

}  // namespace jambo
