/* TEST DOUBLE (mift kernel stand-in): uname(2) as seen inside a test host, with the release of the stand-in kernel
 * that the stand-in boot started (/var/lib/mift-standin/release); every other field, and the release when that
 * file is absent or empty, is the real kernel's. Test hosts share the controller's kernel, so a kernel update can
 * only be shown this way: install.sh --kernel puts this library in the host's /etc/ld.so.preload (its own overlay,
 * never the controller's), so uname -r, Python's platform.release() (Ansible's kernel fact), dkms and apt's hooks
 * all see the booted stand-in kernel. Static binaries still see the real one. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#ifndef MIFT_RELEASE_FILE
#define MIFT_RELEASE_FILE "/var/lib/mift-standin/release"
#endif

int uname(struct utsname *buf) {
  if (syscall(SYS_uname, buf) != 0) return -1;
  int fd = open(MIFT_RELEASE_FILE, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char r[sizeof buf->release];
  ssize_t n = read(fd, r, sizeof r - 1);
  close(fd);
  while (n > 0 && (r[n - 1] == '\n' || r[n - 1] == ' ')) n--;
  if (n <= 0) return 0;
  memset(buf->release, 0, sizeof buf->release);
  memcpy(buf->release, r, (size_t)n);
  return 0;
}
