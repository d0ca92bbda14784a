# One image for every service binary of Better Compute Metal.
FROM rust:1.85-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bins \
 && mkdir -p /out \
 && find target/release -maxdepth 1 -type f -executable \( -name 'bcm' -o -name 'bcm-*' -o -name 'bcx-*' -o -name 'metalctl' -o -name 'bcd' \) -exec cp {} /out/ \;

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl ipmitool ipxe \
 && mkdir -p /var/lib/bcm-boot/tftp /var/cache/bcm-boot /var/lib/bcm-pki /var/lib/bcm-secrets \
 && cp -L /usr/lib/ipxe/undionly.kpxe /usr/lib/ipxe/ipxe.efi /usr/lib/ipxe/snponly.efi /var/lib/bcm-boot/tftp/ \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 bcm \
 && chown bcm /var/lib/bcm-pki && chmod 0700 /var/lib/bcm-pki \
 && chown bcm /var/lib/bcm-secrets && chmod 0711 /var/lib/bcm-secrets
COPY --from=build /out/ /usr/local/bin/
USER bcm
ENTRYPOINT ["/usr/local/bin/bcm-api"]
