// Reads a JSONL trace written with --trace (one line per step, one per lifecycle event) and tells the
// life of one request: its lifecycle events and every row it had in a step, in order.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace jambo::forensics {

// One line per event or row of the request, e.g.
// "step 12  prefill  sample 0 seq 17  positions 0..15 (16 tokens)  slot 7 gen 3  kv blocks [4, 5]".
// Lines that are not JSON objects are counted in num_unreadable rather than stopping the read.
struct RequestLife {
  std::vector<std::string> lines;
  int64_t num_unreadable = 0;
  std::string first_unreadable;  // "line N: why", for the first of them
};

// By the caller's request id (every sample of it), or by the engine's numeric sequence id, which backend and
// law-2 errors name ("sequence 17: ...").
RequestLife read_request_life(std::istream& trace, const std::string& request_id);
RequestLife read_sequence_life(std::istream& trace, int64_t sequence_id);

}  // namespace jambo::forensics
