// Latest-frame semantics for live sources (a camera, a stream URL, a GStreamer pipeline): the
// capture thread puts every frame it reads, the consumer takes only the newest one; a frame that
// was replaced before anyone took it is dropped and counted. Header-only and OpenCV-free (T is
// the frame type), so the tests exercise it without a camera.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <utility>

namespace lightseg::cli {

template <class T>
class LatestFrame {
 public:
  struct Item {
    T frame;
    int64_t sequence = 0;  // 0, 1, 2, ... in capture order (gaps are the drops)
    std::chrono::system_clock::time_point captured;
  };

  // Producer: replaces an untaken frame (counted as dropped) and wakes the consumer.
  void put(T frame, std::chrono::system_clock::time_point captured = std::chrono::system_clock::now()) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (slot_) ++dropped_;
      slot_ = Item{std::move(frame), next_++, captured};
    }
    cv_.notify_one();
  }
  // Producer: no more frames (end of stream or a read error); take() returns what is left, then nothing.
  void close() {
    {
      std::lock_guard<std::mutex> lock(m_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  // Consumer: the newest frame not taken yet, waiting up to `wait` for one; nothing when the
  // wait ends first or the producer closed with nothing left.
  std::optional<Item> take(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait_for(lock, wait, [&] { return slot_.has_value() || closed_; });
    if (!slot_) return std::nullopt;
    std::optional<Item> out = std::move(slot_);
    slot_.reset();
    return out;
  }
  bool closed() const {
    std::lock_guard<std::mutex> lock(m_);
    return closed_ && !slot_;
  }
  int64_t dropped() const {
    std::lock_guard<std::mutex> lock(m_);
    return dropped_;
  }
  int64_t captured() const {
    std::lock_guard<std::mutex> lock(m_);
    return next_;
  }

 private:
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::optional<Item> slot_;
  int64_t next_ = 0, dropped_ = 0;
  bool closed_ = false;
};

}  // namespace lightseg::cli
