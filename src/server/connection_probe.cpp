#include "server/connection_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace jambo::server {

namespace {

struct Endpoint {
  std::string address;
  int port = -1;
};

// The numeric address and port of a socket's own (local) or peer side, if it is a TCP/IP socket.
bool read_endpoint(int socket, bool peer, Endpoint& endpoint) {
  sockaddr_storage storage{};
  socklen_t length = sizeof(storage);
  auto* address = reinterpret_cast<sockaddr*>(&storage);
  if ((peer ? getpeername(socket, address, &length) : getsockname(socket, address, &length)) != 0) return false;
  char text[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET) {
    const auto* ipv4 = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &ipv4->sin_addr, text, sizeof(text));
    endpoint = {text, ntohs(ipv4->sin_port)};
    return true;
  }
  if (storage.ss_family == AF_INET6) {
    const auto* ipv6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &ipv6->sin6_addr, text, sizeof(text));
    endpoint = {text, ntohs(ipv6->sin6_port)};
    return true;
  }
  return false;
}

}  // namespace

// The worker thread owns the request's socket until the handler returns, so the descriptor found here
// stays this connection's for as long as the probe is used.
ConnectionProbe::ConnectionProbe(const httplib::Request& request) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    const int socket = std::atoi(entry.path().filename().c_str());
    Endpoint local, peer;
    if (!read_endpoint(socket, false, local) || local.port != request.local_port) continue;
    if (!read_endpoint(socket, true, peer) || peer.port != request.remote_port || peer.address != request.remote_addr)
      continue;
    socket_ = socket;
    return;
  }
}

bool ConnectionProbe::client_left() const {
  if (socket_ < 0) return false;
  char byte = 0;
  const ssize_t received = recv(socket_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (received == 0) return true;  // the client closed its side
  return received < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace jambo::server
