#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  int mode=atoi(argv[1]); /* 0 raw recv, 1 epoll+recv, 2 epoll+recvmsg+sendmsg */
  int n=20000, sv[2]; socketpair(AF_UNIX,SOCK_SEQPACKET,0,sv);
  cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(0,&cs); sched_setaffinity(0,sizeof cs,&cs);
  pid_t p=fork();
  if(p==0){ close(sv[0]); char b[256]; int ep=epoll_create1(0); struct epoll_event ev={.events=EPOLLIN,.data.fd=sv[1]}; epoll_ctl(ep,EPOLL_CTL_ADD,sv[1],&ev);
    for(;;){ if(mode>0){struct epoll_event e[8]; epoll_wait(ep,e,8,-1);} 
      ssize_t k; if(mode==2){struct iovec io={b,sizeof b}; char cm[128]; struct msghdr m={.msg_iov=&io,.msg_iovlen=1,.msg_control=cm,.msg_controllen=sizeof cm}; k=recvmsg(sv[1],&m,MSG_DONTWAIT|MSG_CMSG_CLOEXEC);} else k=recv(sv[1],b,sizeof b,mode?MSG_DONTWAIT:0);
      if(k<=0) _exit(0);
      if(mode==2){struct iovec io={b,59}; struct msghdr m={.msg_iov=&io,.msg_iovlen=1}; sendmsg(sv[1],&m,MSG_NOSIGNAL|MSG_DONTWAIT);} else send(sv[1],b,59,0);} }
  close(sv[1]); char q[31]={1},r[256]; double *t=malloc(n*sizeof *t);
  int cl = argc > 2 ? atoi(argv[2]) : 0;
  if (cl) { struct timeval tv={30,0}; setsockopt(sv[0],SOL_SOCKET,SO_RCVTIMEO,&tv,sizeof tv); }
  for(int i=0;i<n+2000;i++){ double a=now();
    if (!cl) { send(sv[0],q,31,0); recv(sv[0],r,sizeof r,0); }
    else { struct iovec io={q,31}; struct msghdr m={.msg_iov=&io,.msg_iovlen=1}; sendmsg(sv[0],&m,MSG_NOSIGNAL);
      struct iovec io2={r,sizeof r}; char cm[CMSG_SPACE(4*sizeof(int))]; struct msghdr m2={.msg_iov=&io2,.msg_iovlen=1,.msg_control=cm,.msg_controllen=sizeof cm}; recvmsg(sv[0],&m2,MSG_CMSG_CLOEXEC); }
    if(i>=2000) t[i-2000]=now()-a; }
  close(sv[0]); waitpid(p,0,0); qsort(t,n,sizeof *t,cmp); printf("mode %d p50 %.2f us\n",mode,t[n/2]); return 0; }
