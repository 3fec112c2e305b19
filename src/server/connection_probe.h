// Tells whether the client of a request still being worked on has closed its connection. cpp-httplib
// (0.11) notices a closed connection only when it writes, and a whole (non-streaming) response is
// written once, at the end; the probe finds the request's socket and peeks at it instead.
#pragma once

#include <httplib.h>

namespace jambo::server {

class ConnectionProbe {
 public:
  // Finds the socket whose local and peer addresses are the request's; without one, never reports.
  explicit ConnectionProbe(const httplib::Request& request);
  // True once the client closed or reset its side (an orderly end of stream, or an error).
  bool client_left() const;

 private:
  int socket_ = -1;
};

}  // namespace jambo::server
