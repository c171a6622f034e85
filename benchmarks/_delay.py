"""A TCP relay that holds every chunk back a fixed one-way delay: a network's round
trip on loopback, for benchmarks that compare one request after another with
batched ones (``bench_warmset.py --rtt``).

    python benchmarks/_delay.py LISTEN_PORT TARGET_PORT ONE_WAY_MS

Listens on 127.0.0.1:LISTEN_PORT, connects each client to 127.0.0.1:TARGET_PORT,
and passes bytes both ways unchanged and in order, each chunk ONE_WAY_MS after it
arrived (latency only: no bandwidth limit, no loss). Prints ``ready`` once it
listens; runs until killed.
"""

from __future__ import annotations

import asyncio
import socket
import sys


async def _pass(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(1 << 16)
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
        writer.close()


async def _main(listen: int, target: int, delay: float) -> None:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        for w in (writer, up_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pass(reader, up_writer, delay), _pass(up_reader, writer, delay))

    server = await asyncio.start_server(client, "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000))
