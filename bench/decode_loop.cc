// The decode-only limit of bench/loader_vs_torchvision.sh: every file fully
// decoded to RGB with libjpeg-turbo (TurboJPEG's tjDecompress2, full size, the
// default accurate IDCT and fancy upsampling, as PIL and batchdist decode), in a
// loop on one thread, the files' bytes already in memory (no reading, no crop,
// no resize, no flip: a plain loop that is nothing but the decoder).
//   g++ -O2 bench/decode_loop.cc -lturbojpeg -o decode_loop
//   decode_loop SECONDS FILE...   -> "images_per_s N" (after one untimed pass)
#include <turbojpeg.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: decode_loop SECONDS FILE...\n");
    return 2;
  }
  const double seconds = std::atof(argv[1]);
  std::vector<std::string> files;
  for (int i = 2; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    files.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  tjhandle tj = tjInitDecompress();
  std::vector<unsigned char> rgb;
  long checksum = 0;
  auto decode = [&](const std::string& b) {
    int w = 0, h = 0, sub = 0, cs = 0;
    const auto* p = reinterpret_cast<const unsigned char*>(b.data());
    if (tjDecompressHeader3(tj, p, b.size(), &w, &h, &sub, &cs) != 0) {
      std::fprintf(stderr, "decode_loop: %s\n", tjGetErrorStr2(tj));
      std::exit(1);
    }
    rgb.resize(static_cast<std::size_t>(w) * h * 3);
    if (tjDecompress2(tj, p, b.size(), rgb.data(), w, 0, h, TJPF_RGB, 0) != 0) {
      std::fprintf(stderr, "decode_loop: %s\n", tjGetErrorStr2(tj));
      std::exit(1);
    }
    checksum += rgb[rgb.size() / 2];
  };
  for (const auto& b : files) decode(b);  // warm-up pass
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  long images = 0;
  double elapsed = 0;
  do {
    for (const auto& b : files) decode(b);
    images += static_cast<long>(files.size());
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (elapsed < seconds);
  tjDestroy(tj);
  std::printf("images_per_s %.1f\nimages %ld\nseconds %.3f\nchecksum %ld\n", images / elapsed, images,
              elapsed, checksum);
  return 0;
}
