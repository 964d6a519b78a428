#!/usr/bin/env python3
"""Writes fuzz/corpus/http: the requests a client sends (every route, format, body kind).
Uses two image seeds of fuzz/corpus/image. Run from the repository root."""
import os

d = 'fuzz/corpus/http'
os.makedirs(d, exist_ok=True)
png = open('fuzz/corpus/image/rgb_8_bit.png', 'rb').read()
jpg = open('fuzz/corpus/image/baseline_gray.jpg', 'rb').read()


def req(method, path, body=b'', headers=()):
    h = [f'{method} {path} HTTP/1.1', 'Host: 127.0.0.1'] + list(headers)
    if body or method == 'POST':
        h.append(f'Content-Length: {len(body)}')
    return ('\r\n'.join(h) + '\r\n\r\n').encode() + body


seeds = {
    'healthz': req('GET', '/healthz'),
    'model': req('GET', '/v1/model'),
    'page': req('GET', '/'),
    'notfound-utf8': req('GET', '/%ff%c0%ae'),
    'segment-ids': req('POST', '/v1/segment', png, ['Content-Type: image/png']),
    'segment-color': req('POST', '/v1/segment?format=color', png),
    'segment-overlay-alpha': req('POST', '/v1/segment?format=overlay&alpha=0.3', jpg),
    'segment-json-image': req('POST', '/v1/segment?format=json&image=overlay', png),
    'segment-bad-format': req('POST', '/v1/segment?format=%ff', png),
    'segment-tta': req('POST', '/v1/segment?format=json&scales=0.75,1,1.25&flip=1', png),
    'segment-tta-bad': req('POST', '/v1/segment?scales=1,,4e9&flip=2', png),
    'segment-empty': req('POST', '/v1/segment'),
    'segment-put': req('PUT', '/v1/segment', png),
    'segment-truncated': req('POST', '/v1/segment', png[:len(png) // 2]),
    'keepalive-two': req('GET', '/healthz') + req('POST', '/v1/segment?format=json', png),
    'expect-continue': req('POST', '/v1/segment', png, ['Expect: 100-continue']),
    'over-limit-length': b'POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999999999\r\n\r\n',
}
form = (b'--XyZ\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n'
        b'Content-Type: image/png\r\n\r\n' + png + b'\r\n--XyZ--\r\n')
seeds['multipart'] = req('POST', '/v1/segment?format=json', form, ['Content-Type: multipart/form-data; boundary=XyZ'])
chunks = b'%x\r\n' % 40 + png[:40] + b'\r\n' + b'%x\r\n' % len(png[40:]) + png[40:] + b'\r\n0\r\n\r\n'
seeds['chunked'] = b'POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n' + chunks
# issue 38: framing, hosts, origins, costs
smuggled = b'GET /v1/model HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n'
seeds['chunked-any-case-trailer'] = (b'POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: Chunked\r\n\r\n' +
                                     chunks[:-2] + b'X-Sum: 1\r\n\r\n' + smuggled)
seeds['te-list'] = b'POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n' + chunks
seeds['two-lengths'] = (b'POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\nContent-Length: 50\r\n\r\n'
                        b'hello' + smuggled)
seeds['length-plus'] = b'POST /v1/segment HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: +5\r\n\r\nhello' + smuggled
seeds['get-with-body'] = b'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n' % len(smuggled) + smuggled
seeds['many-headers'] = (b'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n' +
                         b''.join(b'X-a%d: b\r\n' % i for i in range(150)) + b'\r\n')
seeds['host-rebinding'] = b'GET /v1/model HTTP/1.1\r\nHost: evil.example\r\n\r\n'
seeds['cross-origin-post'] = req('POST', '/v1/segment', png, ['Origin: http://evil.example', 'Content-Type: text/plain'])
seeds['content-encoding'] = req('POST', '/v1/segment', png, ['Content-Encoding: deflate'])
seeds['tta-snapped'] = req('POST', '/v1/segment?scales=1.93,1.95,1.97,1.99&flip=1', png)
for name, data in seeds.items():
    open(os.path.join(d, name), 'wb').write(data)
print(f'{len(seeds)} seeds in {d}')
