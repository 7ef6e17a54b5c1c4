// A real HDFS for PaddleCloud's tests: Hadoop's own MiniDFSCluster (one NameNode, one
// DataNode) with WebHDFS and permissions on, started by scripts/hdfs.sh run.
//
//   java -cp <jars>:<dir> MiniHdfs <base dir> <ready file> <platform user>
//
// The OS user that starts it is the HDFS superuser (as on a real cluster, whoever runs the
// NameNode is); <platform user> may act for any user (hadoop.proxyuser.<user>.hosts/groups=*),
// as an operator sets it for PaddleCloud's pfs. When the NameNode and DataNode serve, the
// ready file gets {"url", "namenode_http_port", "namenode_rpc_port", "datanode_http_port",
// "superuser"} (written beside it, then renamed, so a reader never sees half of it). It
// stops cleanly on SIGTERM or when its stdin reaches EOF, so a test run that dies (and so
// closes the pipe) takes the cluster with it.

import java.io.File;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.security.Groups;
import org.apache.hadoop.security.UserGroupInformation;

public final class MiniHdfs {
    private MiniHdfs() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: MiniHdfs <base dir> <ready file> <platform user>");
            System.exit(2);
        }
        File base = new File(args[0]);
        Path ready = Path.of(args[1]);
        String platform = args[2];

        Configuration conf = new Configuration();
        conf.setBoolean("dfs.webhdfs.enabled", true);
        conf.setBoolean("dfs.permissions.enabled", true);
        conf.setInt("dfs.replication", 1);
        // HDFS reserves a whole block (times replication) against a space quota before it
        // writes one: 1 MiB blocks (the smallest the NameNode accepts) let the tests use
        // quotas of a few MiB. A real cluster's 128 MiB blocks behave the same, scaled.
        conf.setLong("dfs.blocksize", 1024 * 1024);
        conf.setBoolean("dfs.namenode.acls.enabled", true);
        // Listings come in pages of 1000 entries on a real NameNode; pages of 4 let the tests
        // see a client page through a directory without making thousands of files.
        conf.setInt("dfs.ls.limit", 4);
        conf.set("hadoop.proxyuser." + platform + ".hosts", "*");
        conf.set("hadoop.proxyuser." + platform + ".groups", "*");
        // Users that exist only in HDFS (the tests' alice and bob) have no OS groups; say so
        // quietly instead of logging a shell failure per lookup.
        conf.set("hadoop.security.group.mapping", "org.apache.hadoop.security.JniBasedUnixGroupsMappingWithFallback");
        // The platform user is an HDFS superuser, as an operator makes PaddleCloud's user
        // (SETOWNER and SETQUOTA need one): a static group mapping puts it in supergroup.
        conf.set("hadoop.user.group.static.mapping.overrides", platform + "=supergroup;dr.who=;");
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, base.getAbsolutePath());

        // The group mapping is a process-wide singleton: load it from this conf before the
        // NameNode asks, or it is built from defaults without the override above.
        UserGroupInformation.setConfiguration(conf);
        Groups.getUserToGroupsMappingServiceWithLoadedConfiguration(conf);

        // HDFS symlinks are off unless a JVM turns them on; the tests turn them on to check
        // that PaddleCloud never follows one an operator's cluster might hold.
        FileSystem.enableSymlinks();

        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf, base)
            .numDataNodes(1)
            .format(true)
            .build();
        Runtime.getRuntime().addShutdownHook(new Thread(cluster::shutdown, "minihdfs-shutdown"));
        cluster.waitActive();

        String superuser = UserGroupInformation.getCurrentUser().getShortUserName();
        int http = cluster.getNameNode().getHttpAddress().getPort();
        int rpc = cluster.getNameNodePort();
        int dnHttp = cluster.getDataNodes().get(0).getInfoPort();
        String json = String.format(
            "{\"url\": \"http://127.0.0.1:%d\", \"namenode_http_port\": %d, \"namenode_rpc_port\": %d,"
                + " \"datanode_http_port\": %d, \"superuser\": \"%s\"}%n",
            http, http, rpc, dnHttp, superuser);
        Path partial = ready.resolveSibling(ready.getFileName() + ".partial");
        Files.writeString(partial, json, StandardCharsets.UTF_8);
        Files.move(partial, ready, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
        System.err.println("minihdfs: ready " + json.trim());

        // Whoever started us holds our stdin: its end (the parent exited, cleanly or not) is
        // the signal to stop. System.exit runs the shutdown hook, which stops the cluster.
        InputStream in = System.in;
        byte[] buffer = new byte[256];
        while (in.read(buffer) >= 0) {
            // nothing to read but the end
        }
        System.err.println("minihdfs: stdin closed, stopping");
        System.exit(0);
    }
}
