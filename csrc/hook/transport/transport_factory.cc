// The transport entries and their choice: see transport_factory.h.
#include "hook/transport/transport_factory.h"

#include <algorithm>
#include <cctype>
#include <sstream>

namespace dynamiq {

std::string TransportEntry::describe() const {
  return backend + " (" + device + (host_staging ? ", staged through host memory" : "") + ")";
}

const std::vector<TransportEntry>& transport_entries() {
  // Gloo completes a receive with any message up to its size and matches
  // operations by tag; NCCL ignores tags and runs a rank's operations in
  // posting order (on one stream once coalesced: experiments/results/nccl_order/),
  // its receives of the exact size. Host staging moves Gloo's host bytes.
  static const std::vector<TransportEntry> entries = {
      {"gloo", "cpu", false, false, MessageSemantics{false, true}},
      {"nccl", "cuda", false, true, MessageSemantics{true, false}},
      {"gloo", "cuda", true, false, MessageSemantics{false, true}},
  };
  return entries;
}

GroupBackends parse_backend_config(std::string_view config) {
  GroupBackends out;
  std::string s(config);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  std::stringstream parts(s);
  std::string part;
  while (std::getline(parts, part, ',')) {
    part.erase(std::remove_if(part.begin(), part.end(), [](unsigned char c) { return std::isspace(c); }), part.end());
    if (part.empty()) continue;
    const size_t colon = part.rfind(':');
    if (colon == std::string::npos) {
      out["cpu"] = part;
      out["cuda"] = part;
    } else {
      out[part.substr(0, colon)] = part.substr(colon + 1);
    }
  }
  return out;
}

namespace {

const TransportEntry* find_entry(const GroupBackends& backends, std::string_view on, std::string_view device,
                                 bool staged) {
  const auto b = backends.find(on);
  if (b == backends.end()) return nullptr;
  for (const TransportEntry& e : transport_entries())
    if (e.backend == b->second && e.device == device && e.host_staging == staged) return &e;
  return nullptr;
}

std::string describe_backends(const GroupBackends& backends) {
  if (backends.empty()) return "none";
  std::string s;
  for (const auto& [dev, name] : backends) s += (s.empty() ? "" : ",") + dev + ":" + name;
  return s;
}

}  // namespace

const TransportEntry& choose_transport(const GroupBackends& backends, std::string_view device, bool staging) {
  const TransportEntry* e = nullptr;
  if (device == "cpu") {
    e = find_entry(backends, "cpu", "cpu", false);
  } else if (device == "cuda") {
    if (!staging) e = find_entry(backends, "cuda", "cuda", false);
    if (!e) e = find_entry(backends, "cpu", "cuda", true);
  }
  if (e) return *e;
  std::string served, unknown;
  for (const TransportEntry& x : transport_entries()) served += (served.empty() ? "" : ", ") + x.describe();
  for (const auto& [dev, name] : backends) {
    const bool known = std::any_of(transport_entries().begin(), transport_entries().end(),
                                   [&](const TransportEntry& x) { return x.backend == name; });
    if (!known && unknown.find("'" + name + "'") == std::string::npos)
      unknown += (unknown.empty() ? "'" : ", '") + name + "'";
  }
  throw Error("dynamiq: cannot send " + std::string(device) + " tensors" +
              (staging && device == "cuda" ? " with host staging" : "") +
              " over this process group (backends: " + describe_backends(backends) + "); dynamiq sends over " +
              served + (unknown.empty() ? "" : "; backend " + unknown + " is not supported (its message matching "
                                               "has not been checked against dynamiq's posting)"));
}

}  // namespace dynamiq
