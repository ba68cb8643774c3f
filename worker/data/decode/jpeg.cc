// JPEG through libjpeg-turbo's libjpeg API: DCT-scaled, windowed decode of the
// crop box only (Note [decode less] in image.h).
//
// Note [libjpeg errors]: libjpeg reports errors through error_exit, which must not
// return; we longjmp back to the setjmp in the function that made the libjpeg
// calls. Those functions (runCrop, runFull) keep no object with a destructor alive
// across libjpeg calls (longjmp would skip it): the decompressor lives in the
// caller's DecodeScratch (a Decompressor, reused from image to image, whose
// destructor frees libjpeg's memory), and so do the scratch vectors. Warnings that mean the data is damaged
// (premature end of file, bad Huffman code, a marker inside entropy data, lost
// restart sync) are errors too: libjpeg would otherwise fill the rest of the
// image with grey and say nothing, and a bad file must be found, not trained on.
// Warnings about harmless oddities (extraneous bytes before a marker, unknown
// JFIF revision, bad ICC marker, odd progression) are ignored, as PIL does.
#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>

#include "worker/data/decode/internal.h"

namespace batchdist::worker::decode_internal {

namespace {

/// The most memory libjpeg may allocate for one image (its coefficient buffers:
/// a progressive JPEG keeps all of them, 2 bytes per coefficient). A hostile
/// header must not make a rank zero gigabytes.
constexpr long kMaxDecoderMemory = 1L << 30;

/// Boxes narrower than this fraction of the (scaled) image width are decoded
/// with jpeg_crop_scanline; wider ones decode whole rows (cropping them costs
/// more than the IDCT it saves).
constexpr double kCropWidthFraction = 0.7;

struct ErrorMgr {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 64];
};

[[noreturn]] void onError(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorMgr*>(cinfo->err);
  if (err->pub.msg_code == JERR_NO_BACKING_STORE || err->pub.msg_code == JERR_OUT_OF_MEMORY) {
    std::snprintf(err->message, sizeof err->message,
                  "the decoder would need more than %ld MiB of memory for this image",
                  kMaxDecoderMemory >> 20);
  } else {
    (*err->pub.format_message)(cinfo, err->message);
  }
  std::longjmp(err->jump, 1);
}

void onMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  cinfo->err->num_warnings++;
  const int code = cinfo->err->msg_code;
  if (code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER || code == JWRN_HUFF_BAD_CODE ||
      code == JWRN_MUST_RESYNC) {
    onError(cinfo);  // Note [libjpeg errors]
  }
  // JWRN_ARITH_BAD_CODE's number depends on how libjpeg was built (jerror.h
  // declares it only with D_ARITH_CODING_SUPPORTED): compare the text.
  const auto* table = cinfo->err->jpeg_message_table;
  if (code >= 0 && code <= cinfo->err->last_jpeg_message && table[code] != nullptr &&
      std::strcmp(table[code], "Corrupt JPEG data: bad arithmetic code") == 0) {
    onError(cinfo);
  }
}

/// Owns one libjpeg decompressor; jpeg_create_decompress happens under setjmp
/// (in run*), jpeg_destroy_decompress here.
struct Decompressor {
  jpeg_decompress_struct cinfo;
  ErrorMgr err;
  Decompressor() {
    std::memset(&cinfo, 0, sizeof cinfo);
    std::memset(&err, 0, sizeof err);
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = onError;
    err.pub.emit_message = onMessage;
  }
  ~Decompressor() { jpeg_destroy_decompress(&cinfo); }
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;
  [[noreturn]] void fail() const { throw DecodeError(std::string("JPEG: ") + err.message); }
};

void begin(j_decompress_ptr cinfo, const uint8_t* data, std::size_t size) {
  jpeg_create_decompress(cinfo);
  cinfo->mem->max_memory_to_use = kMaxDecoderMemory;
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  checkPixels("JPEG", cinfo->image_width, cinfo->image_height);
  // CMYK and YCCK come out as CMYK and are converted below (libjpeg has no
  // CMYK -> RGB); gray, YCbCr and RGB come out as RGB.
  const bool cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  cinfo->out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGB;
  cinfo->dct_method = JDCT_ISLOW;
}

/// (a * b) / 255 rounded, as PIL's MULDIV255.
inline uint8_t mulDiv255(unsigned a, unsigned b) {
  const unsigned t = a * b + 128;
  return static_cast<uint8_t>((t + (t >> 8)) >> 8);
}

/// n CMYK pixels at `src` -> n RGB pixels at `dst` (dst <= src: in place is fine).
/// Adobe (Photoshop) stores CMYK inverted: R = C * K / 255 on the stored values;
/// otherwise R = (255 - C) * (255 - K) / 255. PIL's convert("RGB") likewise.
void cmykToRgb(const uint8_t* src, uint8_t* dst, int n, bool adobe_inverted) {
  for (int i = 0; i < n; ++i, src += 4, dst += 3) {
    unsigned c = src[0], m = src[1], y = src[2], k = src[3];
    if (!adobe_inverted) {
      c = 255 - c;
      m = 255 - m;
      y = 255 - y;
      k = 255 - k;
    }
    dst[0] = mulDiv255(c, k);
    dst[1] = mulDiv255(m, k);
    dst[2] = mulDiv255(y, k);
  }
}

/// Reads `rows` scanlines into rows of `stride` bytes at `dst`.
void readRows(j_decompress_ptr cinfo, uint8_t* dst, std::size_t stride, int rows) {
  JSAMPROW ptrs[16];
  int done = 0;
  while (done < rows) {
    const int n = std::min(16, rows - done);
    for (int i = 0; i < n; ++i) ptrs[i] = dst + static_cast<std::size_t>(done + i) * stride;
    const JDIMENSION got = jpeg_read_scanlines(cinfo, ptrs, static_cast<JDIMENSION>(n));
    if (got == 0) throw DecodeError("JPEG: the decoder returned no rows");
    done += static_cast<int>(got);
  }
}

/// What runCrop leaves for the resampling.
struct CropResult {
  std::size_t offset = 0;  ///< byte offset of the box's first pixel in scratch->rgb
  std::size_t stride = 0;
  int w = 0, h = 0;
  int64_t decoded_pixels = 0;
};

// Note [libjpeg errors]: no objects with destructors here.
bool runCrop(Decompressor* d, const uint8_t* data, std::size_t size, const BoxChooser& choose,
             int out_w, int out_h, DecodeScratch* scratch, CropResult* result) {
  j_decompress_ptr cinfo = &d->cinfo;
  if (setjmp(d->err.jump)) return false;
  begin(cinfo, data, size);
  const int width = static_cast<int>(cinfo->image_width);
  const int height = static_cast<int>(cinfo->image_height);
  const CropBox box = checkedBox(choose(width, height), width, height);
  const int eighths = jpegScaleEighths(box, out_w, out_h);
  cinfo->scale_num = static_cast<unsigned>(eighths);
  cinfo->scale_denom = 8;
  jpeg_start_decompress(cinfo);

  const int sw = static_cast<int>(cinfo->output_width);
  const int sh = static_cast<int>(cinfo->output_height);
  const PixelBox pb = roundBox(box, eighths / 8.0, sw, sh);
  JDIMENSION xoff = 0;
  JDIMENSION cw = cinfo->output_width;
  if (pb.w < kCropWidthFraction * sw) {
    xoff = static_cast<JDIMENSION>(pb.x);
    cw = static_cast<JDIMENSION>(pb.w);
    jpeg_crop_scanline(cinfo, &xoff, &cw);  // widens to iMCU boundaries
  }
  const int comps = cinfo->output_components;
  const std::size_t stride = static_cast<std::size_t>(cinfo->output_width) * comps;
  const int left = pb.x - static_cast<int>(xoff);  // box start within a decoded row
  if (left < 0 || left + pb.w > static_cast<int>(cinfo->output_width)) {
    throw DecodeError("JPEG: internal: cropped window does not cover the box");
  }
  ensureSize(&scratch->rgb, stride * pb.h);
  for (JDIMENSION skip = static_cast<JDIMENSION>(pb.y); skip > 0;) {
    const JDIMENSION n = jpeg_skip_scanlines(cinfo, skip);
    if (n == 0) throw DecodeError("JPEG: the decoder skipped no rows");
    skip -= std::min(n, skip);
  }
  readRows(cinfo, scratch->rgb.data(), stride, pb.h);
  jpeg_abort_decompress(cinfo);

  result->stride = stride;
  result->w = pb.w;
  result->h = pb.h;
  result->decoded_pixels = static_cast<int64_t>(cinfo->output_width) * pb.h;
  if (comps == 4) {
    for (int y = 0; y < pb.h; ++y) {
      uint8_t* row = scratch->rgb.data() + y * stride;
      cmykToRgb(row + static_cast<std::size_t>(left) * 4, row, pb.w, cinfo->saw_Adobe_marker);
    }
    result->offset = 0;
  } else {
    result->offset = static_cast<std::size_t>(left) * 3;
  }
  return true;
}

bool runFull(Decompressor* d, const uint8_t* data, std::size_t size, std::vector<uint8_t>* rgb,
             int* width, int* height) {
  j_decompress_ptr cinfo = &d->cinfo;
  if (setjmp(d->err.jump)) return false;
  begin(cinfo, data, size);
  jpeg_start_decompress(cinfo);
  const int w = static_cast<int>(cinfo->output_width);
  const int h = static_cast<int>(cinfo->output_height);
  const int comps = cinfo->output_components;
  const std::size_t stride = static_cast<std::size_t>(w) * comps;
  ensureSize(rgb, stride * h);
  readRows(cinfo, rgb->data(), stride, h);
  jpeg_abort_decompress(cinfo);
  if (comps == 4) cmykToRgb(rgb->data(), rgb->data(), w * h, cinfo->saw_Adobe_marker);
  rgb->resize(static_cast<std::size_t>(w) * h * 3);
  *width = w;
  *height = h;
  return true;
}

}  // namespace

void jpegCropResize(const uint8_t* data, std::size_t size, const BoxChooser& choose, int out_w,
                    int out_h, bool flip, uint8_t* out, DecodeScratch* scratch,
                    DecodeTimes* times) {
  const Clock::time_point t0 = times ? Clock::now() : Clock::time_point();
  CropResult r;
  {
    Decompressor d;
    if (!runCrop(&d, data, size, choose, out_w, out_h, scratch, &r)) d.fail();
  }
  const Clock::time_point t1 = times ? Clock::now() : Clock::time_point();
  resampleInto(scratch->rgb.data() + r.offset, r.w, r.h, r.stride, out_w, out_h, flip, out,
               &scratch->row);
  if (times) {
    times->decode = std::chrono::duration<double>(t1 - t0).count();
    times->transform = secondsSince(t1);
    times->decoded_pixels = r.decoded_pixels;
  }
}

void jpegFull(const uint8_t* data, std::size_t size, std::vector<uint8_t>* rgb, int* width,
              int* height) {
  Decompressor d;
  if (!runFull(&d, data, size, rgb, width, height)) d.fail();
}

}  // namespace batchdist::worker::decode_internal
