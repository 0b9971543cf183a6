// Line forwarding: StreamForwarder feeding a ConsoleWriter whose fd is a pipe this test
// reads back. Prefixes, split lines, '\r', idle flushes, dangling lines, overlong lines
// split at UTF-8 boundaries, binary bytes, the stderr tail, back-pressure.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "launcher/output.hpp"
#include "test_timeouts.hpp"
#include "test_util.hpp"

namespace {

using ddprun::Console;
using ddprun::ConsoleWriter;
using ddprun::ForwarderConfig;
using ddprun::StreamForwarder;
using namespace std::chrono_literals;

const std::string kCont = StreamForwarder::kContinuation;

// A ConsoleWriter writing into a pipe that a thread drains into a string.
class Capture {
 public:
  explicit Capture(size_t bound = 1 << 20) {
    if (pipe2(fds_, O_CLOEXEC) != 0) std::abort();
    wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    reader_ = std::thread([this] {
      char buf[65536];
      for (;;) {
        ssize_t n = ::read(fds_[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        std::lock_guard lk(mu_);
        data_.append(buf, static_cast<size_t>(n));
        arrived_.notify_all();
      }
    });
    writer_ = std::make_unique<ConsoleWriter>(fds_[1], bound, wake_);
    console_.writer = writer_.get();
  }
  ~Capture() { finish(); }

  Console* console() { return &console_; }
  ConsoleWriter* writer() { return writer_.get(); }
  int wake_fd() const { return wake_; }
  int read_fd() const { return fds_[0]; }

  // Everything written so far: once the writer is flushed, a marker written into the pipe
  // behind its output comes out last, however long the reader thread takes.
  std::string snapshot() {
    static const std::string kMarker("\0<snapshot>\0", 12);
    writer_->flush();
    if (::write(fds_[1], kMarker.data(), kMarker.size()) != static_cast<ssize_t>(kMarker.size())) std::abort();
    std::unique_lock lk(mu_);
    if (!arrived_.wait_for(lk, ddp::test::scaled(30s), [&] { return data_.ends_with(kMarker); }))
      ADD_FAILURE() << "the pipe's reader never saw the snapshot marker";
    else
      data_.resize(data_.size() - kMarker.size());
    return data_;
  }

  // Stops the writer, closes the pipe and returns everything.
  std::string finish() {
    if (writer_) {
      writer_->flush();
      writer_.reset();
      ::close(fds_[1]);
      reader_.join();
      ::close(fds_[0]);
      ::close(wake_);
    }
    return data_;
  }

 private:
  int fds_[2]{-1, -1};
  int wake_ = -1;
  std::unique_ptr<ConsoleWriter> writer_;
  Console console_;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable arrived_;
  std::string data_;
};

auto now() { return std::chrono::system_clock::now(); }

StreamForwarder make_fwd(Console* c, const std::string& prefix, size_t tail = 0, int file_fd = -1) {
  ForwarderConfig cfg;
  cfg.prefix = prefix;
  cfg.console = c;
  cfg.tail_lines = tail;
  cfg.file_fd = file_fd;
  return StreamForwarder(cfg);
}

void feed(StreamForwarder& f, const std::string& s) { f.feed(s.data(), s.size(), now()); }

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string::npos) {
      out.push_back(s.substr(start));
      break;
    }
    out.push_back(s.substr(start, nl - start + 1));
    start = nl + 1;
  }
  return out;
}

// A ~3 MiB line of mixed 1-, 2-, 3- and 4-byte characters; a multi-byte character
// straddles byte kMaxLine, and others may straddle later cuts.
std::string big_utf8_line() {
  std::string s(StreamForwarder::kMaxLine - 1, 'a');  // the lead byte of a 2-byte character comes next
  const std::string pattern = "\xC3\xA9"              // é
                              "x"
                              "\xE2\x82\xAC"          // €
                              "\xF0\x9F\x98\x80"      // 😀
                              "yz";
  while (s.size() < 3 * StreamForwarder::kMaxLine) s += pattern;
  return s;
}

// Checks pieces of a split line and returns the reassembled body.
std::string reassemble(const std::string& out, const std::string& prefix, size_t* pieces) {
  std::string body;
  *pieces = 0;
  std::vector<size_t> torn;  // pieces that are not valid UTF-8 on their own
  for (const std::string& line : split_lines(out)) {
    ++*pieces;
    EXPECT_TRUE(line.starts_with(prefix)) << "piece " << *pieces << " lacks the prefix";
    std::string b = line.substr(prefix.size());
    if (b.ends_with(kCont)) {
      b.resize(b.size() - kCont.size());
      EXPECT_LE(b.size(), StreamForwarder::kMaxLine) << "piece " << *pieces;
    } else {
      EXPECT_TRUE(b.ends_with("\n")) << "last piece must end the line";
      b.pop_back();
    }
    if (!valid_utf8(b)) torn.push_back(*pieces);
    body += b;
  }
  EXPECT_TRUE(torn.empty()) << torn.size() << " of " << *pieces
                            << " pieces split a UTF-8 character, the first is piece " << (torn.empty() ? 0 : torn[0]);
  return body;
}

// ------------------------------------------------------------------ basics

TEST(LauncherOutput, PrefixesEveryLine) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[rank0]:");
  feed(f, "hello\nworld\n");
  EXPECT_EQ(cap.finish(), "[rank0]:hello\n[rank0]:world\n");
  EXPECT_EQ(f.lines(), 2u);
}

TEST(LauncherOutput, EmptyPrefixForwardsRaw) {
  Capture cap;
  auto f = make_fwd(cap.console(), "");
  feed(f, "a\nb\n");
  EXPECT_EQ(cap.finish(), "a\nb\n");
}

// Raw output (empty prefix) keeps an overlong line byte for byte: its pieces go out
// unfinished, as idle flushes do (before: a continuation mark and a newline every 64 KiB,
// which broke a big JSON line piped into a parser). Another worker's line in between ends
// the open line with a newline, as it ends an idle flush's.
TEST(LauncherOutput, EmptyPrefixKeepsAnOverlongLineWhole) {
  const std::string line = big_utf8_line() + "\n";
  {
    Capture cap;
    auto f = make_fwd(cap.console(), "");
    for (size_t off = 0; off < line.size(); off += 40000) f.feed(line.data() + off, std::min<size_t>(40000, line.size() - off), now());
    EXPECT_TRUE(cap.finish() == line) << "the line was changed";
  }
  {
    Capture cap;
    auto f = make_fwd(cap.console(), "");
    auto g = make_fwd(cap.console(), "");
    const size_t half = StreamForwarder::kMaxLine + 1000;
    f.feed(line.data(), half, now());
    feed(g, "other\n");
    f.feed(line.data() + half, line.size() - half, now());
    const std::string out = cap.finish();
    const size_t sent = out.find("\nother\n");
    ASSERT_NE(sent, std::string::npos) << "the other worker's line must start a line of its own";
    EXPECT_TRUE(out.substr(0, sent) + out.substr(sent + 7) == line) << "the line's bytes around it changed";
  }
}

TEST(LauncherOutput, LinesSplitAcrossFeeds) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]");
  feed(f, "hel");
  EXPECT_EQ(cap.snapshot(), "") << "an unfinished line must wait for its end (or an idle flush)";
  feed(f, "lo\nwor");
  feed(f, "ld\n");
  EXPECT_EQ(cap.finish(), "[p]hello\n[p]world\n");
}

TEST(LauncherOutput, CarriageReturnProgressBarForwarded) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]");
  feed(f, "10%\r20%\r30%\r");
  // Each '\r'-terminated update goes out at once, without waiting for a '\n'.
  EXPECT_EQ(cap.snapshot(), "[p]10%\r[p]20%\r[p]30%\r");
}

TEST(LauncherOutput, CrLfNotDoubled) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]");
  feed(f, "one\r\ntwo\r\n");
  EXPECT_EQ(cap.finish(), "[p]one\r\n[p]two\r\n");
}

TEST(LauncherOutput, CrLfSplitAcrossFeedsNotDoubled) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]");
  feed(f, "one\r");
  feed(f, "\ntwo\n");
  EXPECT_EQ(cap.finish(), "[p]one\r\n[p]two\n");
}

TEST(LauncherOutput, IdleFlushThenContinuationWithoutSecondPrefix) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]");
  feed(f, "Password: ");
  EXPECT_TRUE(f.has_partial());
  f.flush_partial(now());
  EXPECT_FALSE(f.has_partial());
  EXPECT_EQ(cap.snapshot(), "[p]Password: ");
  feed(f, "ok\n");
  EXPECT_EQ(cap.finish(), "[p]Password: ok\n");
}


TEST(LauncherOutput, SameStreamTwoIdleFlushesOnePrefix) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]");
  feed(f, "a");
  f.flush_partial(now());
  feed(f, "b");
  f.flush_partial(now());
  feed(f, "c\n");
  EXPECT_EQ(cap.finish(), "[p]abc\n");
}

// ------------------------------------------------------------------ long lines, UTF-8

TEST(LauncherOutput, MegabyteLineSplitAtUtf8BoundariesFedWhole) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[r0]:");
  const std::string line = big_utf8_line();
  feed(f, line + "\n");
  const std::string out = cap.finish();
  size_t pieces = 0;
  EXPECT_EQ(reassemble(out, "[r0]:", &pieces), line);
  EXPECT_GE(pieces, line.size() / StreamForwarder::kMaxLine);
  EXPECT_LE(pieces, line.size() / StreamForwarder::kMaxLine + 2);
}

// A line of exactly kMaxLine bytes goes whole, and one of twice that in two pieces: the
// cut counts what the line holds, not its end (which went out as an empty line of its own,
// whole or in reads that end before it).
TEST(LauncherOutput, LinesOfExactlyTheLimitEndWithoutAnEmptyLine) {
  for (size_t reads : {1, 2}) {
    Capture cap;
    auto f = make_fwd(cap.console(), "[r0]:");
    const std::string one(StreamForwarder::kMaxLine, 'a'), two(2 * StreamForwarder::kMaxLine, 'b');
    if (reads == 1) {
      feed(f, one + "\n" + two + "\n");
    } else {
      feed(f, one);
      feed(f, "\n" + two);
      feed(f, "\n");
    }
    const std::string half(StreamForwarder::kMaxLine, 'b');
    EXPECT_EQ(cap.finish(), "[r0]:" + one + "\n[r0]:" + half + StreamForwarder::kContinuation + "[r0]:" + half + "\n")
        << "fed in " << reads << " read(s)";
  }
}

TEST(LauncherOutput, MegabyteLineSplitAtUtf8BoundariesFedInPipeSizedReads) {
  // ddprun reads worker pipes 64 KiB at a time: the line arrives in 64 KiB feeds, and a
  // feed can end in the middle of a character.
  Capture cap;
  auto f = make_fwd(cap.console(), "[r0]:");
  const std::string line = big_utf8_line() + "\n";
  for (size_t off = 0; off < line.size(); off += 65536)
    f.feed(line.data() + off, std::min<size_t>(65536, line.size() - off), now());
  const std::string out = cap.finish();
  size_t pieces = 0;
  EXPECT_EQ(reassemble(out, "[r0]:", &pieces), line.substr(0, line.size() - 1));
}

TEST(LauncherOutput, MegabyteLineFedInOddSizedReads) {
  Capture cap;
  auto f = make_fwd(cap.console(), "");
  const std::string line = big_utf8_line() + "\n";
  for (size_t off = 0; off < line.size(); off += 7777)
    f.feed(line.data() + off, std::min<size_t>(7777, line.size() - off), now());
  const std::string out = cap.finish();
  size_t pieces = 0;
  EXPECT_EQ(reassemble(out, "", &pieces), line.substr(0, line.size() - 1));
}

TEST(LauncherOutput, IdleFlushesInsideAnOverlongLineKeepItsPiecesWithinTheLimit) {
  // Parts of a long line flushed while idle stay on the console line that the rest of the
  // line continues: with them, every piece is still at most kMaxLine.
  const std::string line = big_utf8_line() + "\n";
  for (std::vector<size_t> flushed_after : {std::vector<size_t>{100000, 3, 70000}, {StreamForwarder::kMaxLine}}) {
    SCOPED_TRACE(flushed_after[0]);
    Capture cap;
    auto f = make_fwd(cap.console(), "[p]");
    size_t off = 0;
    for (size_t n : flushed_after) {
      f.feed(line.data() + off, n, now());
      f.flush_partial(now());
      off += n;
    }
    f.feed(line.data() + off, line.size() - off, now());
    const std::string out = cap.finish();
    for (const std::string& l : split_lines(out)) EXPECT_LE(l.size(), 3 + StreamForwarder::kMaxLine + kCont.size());
    size_t pieces = 0;
    EXPECT_EQ(reassemble(out, "[p]", &pieces), line.substr(0, line.size() - 1));
  }
}

TEST(LauncherOutput, FlushPartialKeepsIncompleteUtf8) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]");
  feed(f, "ab\xE2\x82");  // "ab" and the first two bytes of €
  f.flush_partial(now());
  EXPECT_EQ(cap.snapshot(), "[p]ab");
  feed(f, "\xAC\n");
  EXPECT_EQ(cap.finish(), "[p]ab\xE2\x82\xAC\n");
}

TEST(LauncherOutput, Utf8ByteByByteWithIdleFlushes) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]");
  const std::string text = "x\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";  // xé€😀
  for (char c : text) {
    f.feed(&c, 1, now());
    f.flush_partial(now());
  }
  feed(f, "\n");
  const std::string out = cap.finish();
  EXPECT_EQ(out, "[p]" + text + "\n");
}

TEST(LauncherOutput, BinaryBytesPassThrough) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]");
  std::string bin;
  for (int c = 0; c < 256; ++c)
    if (c != '\n' && c != '\r') bin += static_cast<char>(c);
  feed(f, bin + "\n");
  EXPECT_EQ(cap.finish(), "[p]" + bin + "\n");
}

// ------------------------------------------------------------------ end of stream, tail

TEST(LauncherOutput, FinishAddsNewline) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]");
  feed(f, "no newline at the end");
  f.finish(now());
  EXPECT_EQ(cap.finish(), "[p]no newline at the end\n");
}

TEST(LauncherOutput, FinishAfterIdleFlushEndsTheLine) {
  // A progress bar without a final newline, flushed while idle, then the worker exits:
  // the console line must still be ended so the next output does not glue onto it.
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]");
  feed(f, "100%");
  f.flush_partial(now());
  f.finish(now());
  EXPECT_EQ(cap.finish(), "[p]100%\n");
}

TEST(LauncherOutput, FinishWithNothingPendingAddsNothing) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]");
  feed(f, "done\n");
  f.finish(now());
  EXPECT_EQ(cap.finish(), "[p]done\n");
}

TEST(LauncherOutput, TailKeepsLastLines) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]", 3);
  feed(f, "l1\nl2\r\nl3\nl4\nl5");
  f.finish(now());
  ASSERT_EQ(f.tail().size(), 3u);
  EXPECT_EQ(f.tail()[0], "l3");
  EXPECT_EQ(f.tail()[1], "l4");
  EXPECT_EQ(f.tail()[2], "l5");
}

// The tail keeps what a terminal showed: a progress bar's states, each ended by '\r', are
// replaced by what follows on their line (a report full of "10%", "20%"... before), and
// the lone '\r' a bar starts with makes no empty line.
TEST(LauncherOutput, TailKeepsAProgressBarsLastState) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]", 4);
  feed(f, "start\n\r 0%|\r 50%|\r 100%|\r");
  feed(f, "\ndone\n\rnext 1\rnext 2\r\nfailed: x\n");
  f.finish(now());
  EXPECT_EQ(std::vector<std::string>(f.tail().begin(), f.tail().end()),
            (std::vector<std::string>{" 100%|", "done", "next 2", "failed: x"}));
  EXPECT_EQ(cap.finish(), "[p]start\n[p] 0%|\r[p] 50%|\r[p] 100%|\r\n[p]done\n[p]next 1\r[p]next 2\r\n[p]failed: x\n");
}

// The tail keeps a line's words without its escape sequences (a worker writing to a
// terminal colours its traceback): colours, a title, a hyperlink, a cut sequence at the end.
TEST(LauncherOutput, TailLeavesOutEscapeSequences) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]", 4);
  const std::string coloured = "\x1b[1;35mModuleNotFoundError\x1b[0m: \x1b[35mNo module named 'x'\x1b[0m\n";
  feed(f, coloured);
  feed(f, "\x1b]0;title\x07see \x1b]8;;http://a\x1b\\docs\x1b]8;;\x1b\\ \x1b(Bok\x1b[?25h\a\n");
  feed(f, "ding\a\n\x1b[0m\n");  // a bell alone; a line of escapes alone is no line
  feed(f, "cut \x1b[3");
  f.finish(now());
  EXPECT_EQ(std::vector<std::string>(f.tail().begin(), f.tail().end()),
            (std::vector<std::string>{"ModuleNotFoundError: No module named 'x'", "see docs ok", "ding", "cut "}));
  EXPECT_EQ(cap.finish().substr(0, coloured.size() + 3), "[p]" + coloured);  // the console keeps them
}

// A prefix's width on a terminal (a worker's terminal is that much narrower): colours take
// no column, a CJK character or an emoji two.
TEST(LauncherOutput, TerminalColumnsOfAPrefix) {
  EXPECT_EQ(ddprun::terminal_columns("[rank0]:"), 8u);
  EXPECT_EQ(ddprun::terminal_columns("\x1b[32m[rank0]\x1b[0m:"), 8u);
  EXPECT_EQ(ddprun::terminal_columns("[\u30e9\u30f3\u30af0]:"), 10u);  // [ランク0]:
  EXPECT_EQ(ddprun::terminal_columns("[\U0001F680 0]"), 6u);
  EXPECT_EQ(ddprun::terminal_columns("\u2705e\u0301"), 3u);  // ✅ é (e and a combining accent)
  EXPECT_EQ(ddprun::terminal_columns("\xe9t\xe9"), 3u);  // not UTF-8: a column a byte
  EXPECT_EQ(ddprun::terminal_columns(""), 0u);
}

// A bar's last state before the stream ends (no newline after it) stays in the tail.
TEST(LauncherOutput, TailKeepsABarLeftOpenAtTheEnd) {
  auto f = make_fwd(nullptr, "[p]", 3);
  feed(f, "\r10%\r99%\r");
  f.finish(now());
  EXPECT_EQ(std::vector<std::string>(f.tail().begin(), f.tail().end()), std::vector<std::string>{"99%"});
}

// A last line without a newline that an idle flush sent is in the tail (the report said
// "no output" for a worker whose last words were "fatal: ..." without a newline).
TEST(LauncherOutput, TailKeepsALastLineSentByAnIdleFlush) {
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]", 3);
  feed(f, "one\nfatal: no newline");
  f.flush_partial(now());
  f.finish(now());
  EXPECT_EQ(std::vector<std::string>(f.tail().begin(), f.tail().end()),
            (std::vector<std::string>{"one", "fatal: no newline"}));
  EXPECT_EQ(cap.finish(), "[p]one\n[p]fatal: no newline\n");
}

// Raw output keeps the worker's bytes to the end: no newline added to an unfinished last
// line (whether an idle flush sent part of it or not), the lone '\r' kept; another
// worker's line still starts on a line of its own.
TEST(LauncherOutput, RawOutputAddsNoNewlineAtTheEnd) {
  Capture cap;
  auto f = make_fwd(cap.console(), "", 2);
  auto g = make_fwd(cap.console(), "");
  feed(f, "\rbar\rdone");
  f.flush_partial(now());
  feed(f, " now");
  f.finish(now());
  EXPECT_EQ(cap.snapshot(), "\rbar\rdone now");
  EXPECT_EQ(std::vector<std::string>(f.tail().begin(), f.tail().end()), std::vector<std::string>{"done now"});
  feed(g, "other\n");
  EXPECT_EQ(cap.finish(), "\rbar\rdone now\nother\n");
}

// On a terminal, the bars of several workers (each state after a '\r') take turns on one
// line: another worker's line erases a bar's state rather than ending it with a newline (4
// ranks' bars scrolled the terminal, a line per state), and a bar erased so is drawn again
// when its worker goes on with that line or its stream ends. A line that is no bar is
// still ended with a newline; elsewhere than on a terminal, every line is.
// Two workers, [0] and [1], on one console (a terminal, or a pipe).
struct TwoOnOneConsole {
  explicit TwoOnOneConsole(bool terminal) { cap.writer()->set_terminal(terminal); }
  Capture cap;
  StreamForwarder f = make_fwd(cap.console(), "[0]");
  StreamForwarder g = make_fwd(cap.console(), "[1]");
};

TEST(LauncherOutput, AnotherStreamClosesDanglingLine) {
  TwoOnOneConsole t(false);
  auto& [cap, a, b] = t;
  feed(a, "progress");
  a.flush_partial(now());
  feed(b, "line from b\n");
  feed(a, " done\n");
  EXPECT_EQ(cap.finish(), "[0]progress\n[1]line from b\n[0] done\n");
}

// Two workers' bar states, each sent by an idle flush, one after the other.
void two_bars(StreamForwarder& f, StreamForwarder& g) {
  feed(f, "\r10%");
  f.flush_partial(now());
  feed(g, "\r20%");
  g.flush_partial(now());
}

TEST(LauncherOutput, BarsOfSeveralWorkersTakeTurnsOnATerminal) {
  TwoOnOneConsole t(true);
  auto& [cap, f, g] = t;
  two_bars(f, g);
  feed(f, "\r50%");
  f.flush_partial(now());
  feed(g, "done\n");
  f.finish(now());
  g.finish(now());
  EXPECT_EQ(cap.snapshot(), "[0]10%\r\x1b[K[1]20%\r\x1b[K[0]50%\r\x1b[K[1]20%done\n[0]50%\n");
  feed(f, "Password: ");  // no bar: ended with a newline
  f.flush_partial(now());
  feed(g, "x\n");
  EXPECT_EQ(cap.finish(), "[0]10%\r\x1b[K[1]20%\r\x1b[K[0]50%\r\x1b[K[1]20%done\n[0]50%\n[0]Password: \n[1]x\n");
}

// A bar whose own '\r' came (its next state not yet): another worker's line still erases it
// (it overwrote the state from its first column, leaving the rest of it behind).
TEST(LauncherOutput, ABarBetweenItsCarriageReturnAndItsNextStateIsErasedToo) {
  TwoOnOneConsole t(true);
  auto& [cap, f, g] = t;
  feed(f, "\r10%");
  f.flush_partial(now());
  feed(f, "\r20%");
  feed(g, "line\n");
  f.finish(now());
  EXPECT_EQ(cap.finish(), "[0]10%\r\r\x1b[K[1]line\n[0]20%\n");
}

// A state ended by '\r' on a terminal: the next state gets its prefix, and the last one stays
// on its line when the stream ends.
TEST(LauncherOutput, StatesEndedByCarriageReturnOnATerminal) {
  Capture cap;
  cap.writer()->set_terminal(true);
  auto f = make_fwd(cap.console(), "[p]");
  feed(f, "10%\r20%\r");
  f.finish(now());
  EXPECT_EQ(cap.finish(), "[p]10%\r[p]20%\r\n");
}

// A bar state over 4 KiB, erased, comes back whole (the redraw cut it at 4096 bytes).
TEST(LauncherOutput, ALongBarStateIsDrawnAgainWhole) {
  TwoOnOneConsole t(true);
  auto& [cap, f, g] = t;
  const std::string state = std::string(6000, 'y') + " END";
  feed(f, "\r" + state);
  f.flush_partial(now());
  feed(g, "plain\n");
  feed(f, "\n");
  EXPECT_EQ(cap.finish(), "[0]" + state + "\r\x1b[K[1]plain\n[0]" + state + "\n");
}

// States ended by '\r' ("state\r"), erased, and a stream that ends without a newline: its
// last state is drawn again (it vanished); the other bar's too, which that redraw erased.
TEST(LauncherOutput, AnErasedStateEndedByCarriageReturnIsDrawnAgainAtTheEnd) {
  TwoOnOneConsole t(true);
  auto& [cap, f, g] = t;
  feed(f, "1/3\r");
  feed(g, "\r5/8");
  g.flush_partial(now());
  f.finish(now());
  g.finish(now());
  EXPECT_EQ(cap.finish(), "[0]1/3\r\r\x1b[K[1]5/8\r\x1b[K[0]1/3\n[1]5/8\n");
}

// In a file or pipe, another worker's line starts a line of its own after a state ended by
// '\r' too (it ran into it), and an interrupted line's '\n' adds no empty prefixed line.
TEST(LauncherOutput, ElsewhereAnotherWorkersLineStartsALineOfItsOwn) {
  TwoOnOneConsole t(false);
  auto& [cap, f, g] = t;
  feed(f, "1/5\r");
  feed(g, "log\n");
  feed(f, "2/5\r");
  f.finish(now());
  EXPECT_EQ(cap.snapshot(), "[0]1/5\r\n[1]log\n[0]2/5\r\n");
  auto h = make_fwd(cap.console(), "[2]");
  feed(h, "\r10%");
  h.flush_partial(now());
  feed(g, "x\n");
  feed(h, "\n");
  EXPECT_EQ(cap.finish(), "[0]1/5\r\n[1]log\n[0]2/5\r\n[2]10%\n[1]x\n");
}

// Review cases, on a terminal: a state ended by '\r', erased, whose '\n' comes later; a
// lone '\r' after the erase, then the stream's end; a state that a log line ended (it is
// on the screen: not drawn twice); a state begun before an idle flush (drawn whole).
TEST(LauncherOutput, ErasedBarsAreDrawnAgainOnceAndWhole) {
  auto on_terminal = [](auto&& steps) {
    TwoOnOneConsole t(true);
    steps(t.cap, t.f, t.g);
    return t.cap.finish();
  };
  EXPECT_EQ(on_terminal([](Capture&, StreamForwarder& f, StreamForwarder& g) {
              feed(f, "loss 0.5\r");
              feed(g, "x\n");
              feed(f, "\n");
            }),
            "[0]loss 0.5\r\r\x1b[K[1]x\n[0]loss 0.5\n");
  EXPECT_EQ(on_terminal([](Capture&, StreamForwarder& f, StreamForwarder& g) {
              two_bars(f, g);
              feed(f, "\r");
              f.finish(now());
            }),
            "[0]10%\r\x1b[K[1]20%\r\x1b[K[0]10%\n");
  EXPECT_EQ(on_terminal([](Capture& cap, StreamForwarder& f, StreamForwarder& g) {
              feed(f, "\r10%");
              f.flush_partial(now());
              cap.writer()->push_line("log\n");
              feed(g, "x\n");
              f.finish(now());
            }),
            "[0]10%\nlog\n[1]x\n");
  EXPECT_EQ(on_terminal([](Capture&, StreamForwarder& f, StreamForwarder& g) {
              feed(f, "abc");
              f.flush_partial(now());
              feed(f, "def\r");
              feed(g, "x\n");
              f.finish(now());
            }),
            "[0]abcdef\r\r\x1b[K[1]x\n[0]abcdef\n");
}

// Review cases elsewhere: raw output keeps a "\r\n" split across reads; a repeated '\r' adds
// no empty prefixed piece; an interrupted line's bare "\r\n" adds no empty line.
TEST(LauncherOutput, CarriageReturnsInAPipeAddNothing) {
  {
    Capture cap;
    auto f = make_fwd(cap.console(), "");
    feed(f, "one\r");
    feed(f, "\ntwo\n");
    EXPECT_EQ(cap.finish(), "one\r\ntwo\n");
  }
  TwoOnOneConsole t(false);
  auto& [cap, f, g] = t;
  feed(f, "\r10%\r\r20%\r\n");
  feed(f, "abc");
  f.flush_partial(now());
  feed(g, "x\n");
  feed(f, "\r\n");
  EXPECT_EQ(cap.finish(), "[0]10%\r[0]20%\r\n[0]abc\n[1]x\n");
}

TEST(LauncherOutput, BarsAreEndedWithANewlineElsewhere) {
  TwoOnOneConsole t(false);
  auto& [cap, f, g] = t;
  two_bars(f, g);
  f.finish(now());
  g.finish(now());
  EXPECT_EQ(cap.finish(), "[0]10%\n[1]20%\n");
}

TEST(LauncherOutput, TailWithoutConsole) {
  auto f = make_fwd(nullptr, "[p]", 2);
  feed(f, "a\nb\nc\n");
  ASSERT_EQ(f.tail().size(), 2u);
  EXPECT_EQ(f.tail()[0], "b");
  EXPECT_EQ(f.tail()[1], "c");
  EXPECT_EQ(f.lines(), 3u);
}

TEST(LauncherOutput, LogFileGetsRawBytes) {
  ddprun_test::TempDir dir;
  int fd = ::open(dir.file("stdout.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  Capture cap;
  auto f = make_fwd(cap.console(), "[p]", 0, fd);
  feed(f, "one\ntw");
  feed(f, "o\r\nthree");
  f.finish(now());
  ::close(fd);
  EXPECT_EQ(ddprun_test::read_file(dir.file("stdout.log")), "one\ntwo\r\nthree");
  EXPECT_EQ(cap.finish(), "[p]one\n[p]two\r\n[p]three\n");
}

TEST(LauncherOutput, Timestamps) {
  Capture cap;
  ForwarderConfig cfg;
  cfg.prefix = "[p]";
  cfg.console = cap.console();
  cfg.timestamps = true;
  StreamForwarder f(cfg);
  feed(f, "hello\n");
  const std::string out = cap.finish();
  EXPECT_TRUE(std::regex_match(out, std::regex(R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} \[p\]hello\n)"))) << out;
}

// ------------------------------------------------------------------ prefix macros

TEST(LauncherOutput, ExpandPrefix) {
  EXPECT_EQ(ddprun::expand_prefix("[${role_name}${local_rank}@${hostname}]", 5, 1, "trainer", "nodeA"),
            "[trainer1@nodeA]");
  EXPECT_EQ(ddprun::expand_prefix("[rank${rank}]:", 12, 0, "default", "h"), "[rank12]:");
  EXPECT_EQ(ddprun::expand_prefix("${rank}/${rank}", 3, 0, "r", "h"), "3/3");
  EXPECT_EQ(ddprun::expand_prefix("${unknown} $ ${rank", 3, 0, "r", "h"), "${unknown} $ ${rank");
  EXPECT_EQ(ddprun::expand_prefix("", 3, 0, "r", "h"), "");
}

// torchrun 2.x expands the template with string.Template.safe_substitute: these are what
// Python gives for each (role_name "r", rank 3, local_rank 1).
TEST(LauncherOutput, ExpandPrefixAsPythonsTemplate) {
  const std::pair<const char*, const char*> cases[] = {
      {"[$rank]:", "[3]:"},         {"$$rank", "$rank"},         {"$ranks $rank_ $rank.x", "$ranks $rank_ 3.x"},
      {"${rank}x$local_rank$role_name", "3x1r"}, {"$", "$"},    {"${ rank}", "${ rank}"},
      {"$1rank", "$1rank"},         {"a$$$rank", "a$3"},         {"${unknown} $ ${rank", "${unknown} $ ${rank"},
  };
  for (const auto& [tmpl, want] : cases) EXPECT_EQ(ddprun::expand_prefix(tmpl, 3, 1, "r", "h"), want) << tmpl;
}

// ------------------------------------------------------------------ ConsoleWriter

TEST(LauncherOutput, ConsoleWriterKeepsOrderAcrossManyChunks) {
  Capture cap;
  std::string expect;
  for (int i = 0; i < 20000; ++i) {
    std::string s = "chunk " + std::to_string(i) + "\n";
    expect += s;
    cap.writer()->push(std::move(s));
  }
  EXPECT_EQ(cap.finish(), expect);
}

TEST(LauncherOutput, ConsoleWriterBackPressureAndWake) {
  // A console nobody reads: once the bound is queued, full() says so; when it drains
  // below half, the eventfd wakes the supervisor.
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  int wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const size_t pipe_cap = static_cast<size_t>(fcntl(fds[1], F_GETPIPE_SZ));
  {
    ConsoleWriter w(fds[1], 64 * 1024, wake);
    // Fill the pipe, then queue the bound on top.
    for (size_t queued = 0; queued < pipe_cap + 128 * 1024; queued += 4096) w.push(std::string(4096, 'x'));
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(w.full());
    uint64_t v = 0;
    EXPECT_LT(::read(wake, &v, sizeof v), 0) << "no wake-up while still full";
    // Drain the pipe.
    std::thread drain([&] {
      char buf[65536];
      size_t got = 0;
      while (got < pipe_cap + 128 * 1024) {
        ssize_t n = ::read(fds[0], buf, sizeof buf);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
    });
    w.flush();
    drain.join();
    EXPECT_FALSE(w.full());
    pollfd p{wake, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, static_cast<int>(ddp::test::scaled(30s).count())), 1)
        << "the eventfd must be written when the queue drains";
  }
  ::close(fds[0]);
  ::close(fds[1]);
  ::close(wake);
}

}  // namespace
